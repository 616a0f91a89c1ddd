"""Arithmetic and presentation of `fastrl bench`: the machine bound, the efficiency, the
bottleneck in words, the printed table and the JSON document.

The bound (design.md §6), with per-core rates (per CPU second) of the isolated stages:
    bound_env_steps_per_s = C / (1/env + 1/infer + epochs/learn)
where `learn` counts samples of one pass over a batch. The sampling bound drops the learner term.
A multi-threaded learner's `learn` rate is the better of its configured threads and one thread
(components.bench_learn says why).
"""

from __future__ import annotations

import statistics
import sys
import time

from fastrl.bench.measure import headline_rate
from fastrl.bench.rounds import rounds_lines

SCHEMA_VERSION = 1
STAGES = ("env", "infer", "learn", "sample", "train")


def machine_bound(cores: int, env_per_core: float, infer_per_core: float, learn_per_core: float | None,
                  epochs: int) -> float:
    """Env steps/s with C cores and perfect overlap; learn_per_core None = sampling only."""
    cost_s = 1.0 / env_per_core + 1.0 / infer_per_core
    if learn_per_core is not None:
        cost_s += epochs / learn_per_core
    return cores / cost_s


def bottleneck(stage: dict, cores: int) -> str:
    """Which part limits a system stage, in words, from its busy/idle fractions and CPU use."""
    lb, ri, ib = stage["learner_busy_fraction"], stage["rollout_idle_fraction"], stage["inference_busy_fraction"]
    cpu = stage["cpu_percent_total"]
    if lb >= 0.9 and stage.get("learner_trains", True):
        kind = "learner-bound"
    elif ri <= 0.1:
        kind = "env-bound"
    elif ib >= 0.9:
        kind = "inference-bound"
    elif cpu >= 90.0 * cores:
        kind = f"CPU-bound (all {cores} cores busy)"
    else:
        kind = "latency-bound (no process saturated)"
    learner = f"learner busy {lb:.0%}, " if stage.get("learner_trains", True) else ""
    return (f"{kind}: {learner}rollout workers idle {ri:.0%}, inference busy {ib:.0%}; "
            f"processes use {cpu:.0f}% CPU of {100 * cores}%")


def cpu_ms_per_env_step(stage: dict) -> dict[str, float]:
    """CPU ms that each role's processes (rollout, inference, learner) spent per env step of a sample
    or train stage, from their CPU use and the stage's rate; empty if nothing was counted."""
    rate = headline_rate(stage["env_steps_per_s"])
    costs: dict[str, float] = {}
    if rate <= 0:
        return costs
    for proc in stage.get("processes", []):
        role = proc["name"].removeprefix("fastrl-").split("-")[0]
        costs[role] = costs.get(role, 0.0) + proc["cpu_percent"] / 100 / rate * 1e3
    return costs


def cpu_costs(result: dict, name: str) -> dict | None:
    """Where the efficiency of the sample or train stage goes: each role's CPU ms per env step in the
    run beside what the bound charges it (the isolated stages' per-core costs), and the share of the
    cores the run's processes kept busy. The efficiency splits exactly into the two factors,
        rate / bound = (bound cost / run cost) x (CPU used / cores),
    so a low one reads either as work that costs more in the run than alone (smaller inference
    batches, learner shards, caches the other processes leave cold) or as cores left idle.
    None when the stage counted no processes, or the env and infer stages did not run."""
    stages = result["stages"]
    stage, env, infer, learn = (stages.get(k) for k in (name, "env", "infer", "learn"))
    run = cpu_ms_per_env_step(stage) if stage else {}
    if not run or not env or not infer:
        return None
    env_ms, infer_ms = 1e3 / env["env_steps_per_core_s"], 1e3 / infer["samples_per_core_s"]
    # a rollout worker that acts itself (no inference process) does both stages' work
    bound = {"rollout": env_ms, "inference": infer_ms} if "inference" in run else {"rollout": env_ms + infer_ms}
    if name == "train":
        if not learn:
            return None
        bound["learner"] = 1e3 * result["counts"]["epochs"] / learn["samples_per_core_s"]
    else:
        bound["learner"] = 0.0  # it discards: the sampling bound has no learner term
    cores_used = sum(proc["cpu_percent"] for proc in stage["processes"]) / 100
    # to a nanosecond: a CartPole env step costs a few microseconds
    return {"run_ms": {k: round(v, 6) for k, v in run.items()}, "bound_ms": {k: round(v, 6) for k, v in bound.items()},
            "cost_ratio": round(sum(bound.values()) / sum(run.values()), 4),
            "cores_used_fraction": round(cores_used / result["cores"], 4)}


def summarize(result: dict) -> None:
    """Fill in the bound, efficiency and bottleneck from whatever stages ran."""
    stages, cores = result["stages"], result["cores"]
    env, infer, learn = (stages.get(k) for k in ("env", "infer", "learn"))
    bound: dict = {"cores": cores, "formula": "C / (1/env + 1/infer + epochs/learn), per-core rates"}
    if env and infer:
        e, i = env["env_steps_per_core_s"], infer["samples_per_core_s"]
        bound["sample_env_steps_per_s"] = round(machine_bound(cores, e, i, None, 1), 1)
        if learn:
            bound["train_env_steps_per_s"] = round(
                machine_bound(cores, e, i, learn["samples_per_core_s"], result["counts"]["epochs"]), 1)
    result["bound"] = bound
    eff = {}
    for stage, key in (("train", "train_env_steps_per_s"), ("sample", "sample_env_steps_per_s")):
        if stage in stages and key in bound:
            eff[stage] = round(headline_rate(stages[stage]["env_steps_per_s"]) / bound[key], 3)
    result["efficiency"] = eff
    for stage in ("sample", "train"):
        if stage in stages:
            stages[stage]["bottleneck"] = bottleneck(stages[stage], cores)
            costs = cpu_costs(result, stage)
            if costs is not None:
                stages[stage]["cpu_costs"] = costs
    last = "train" if "train" in stages else "sample" if "sample" in stages else None
    result["bottleneck"] = stages[last]["bottleneck"] if last else None


def _spread_text(s: dict) -> str:
    if not s["windows"]:
        return "n/a"
    return f"{headline_rate(s):>10,.0f}   {s['min']:,.0f}-{s['max']:,.0f} ({s['windows']} windows)"


def format_table(result: dict) -> str:
    stages, fpe = result["stages"], result["frames_per_env_step"]
    lines = [f"fastrl bench: {result['env_id']}, {result['cores']} cores, preset {result['config']}",
             f"{'stage':<7} {'what':<38} {'rate':>10}   {'spread (min-max, windows)':<34} per core"]
    rows = {"env": ("env steps/s, random actions", "env_steps"), "infer": ("", "samples"),
            "learn": ("", "samples"), "sample": ("env steps/s, learner discards", None),
            "train": ("env steps/s, training", None)}
    for name in STAGES:
        if name not in stages:
            continue
        st = stages[name]
        what, unit = rows[name]
        if name == "infer":
            # the numpy backend acts through fastrl_ext's kernel where it is built (system.native_acting)
            backend = "fastrl_ext" if st.get("native_acting") else st.get("backend")
            what = f"samples/s at batch {st['batch']}" + (f", {backend}" if backend else "")
        elif name == "learn":
            what = f"samples/s, {st['epochs']} epoch(s), batch {st['batch_size']}"
        key = f"{unit}_per_s" if unit else "env_steps_per_s"
        per_core = f"{st[f'{unit}_per_core_s']:,.0f}" if unit else ""
        lines.append(f"{name:<7} {what:<38} {_spread_text(st[key]):<47} {per_core}")
        if "samples_per_core_s_1_thread" in st:
            configured = (f"{st['shards']} shards ({st.get('split', 'rows')})" if st.get("shards", 1) > 1
                          else f"{st['torch_threads']} threads")
            lines.append(f"{'':<7} {'  per core: ' + configured + ' / 1 thread':<38} "
                         f"{st['samples_per_core_s_at_configured_threads']:>10,.0f} / "
                         f"{st['samples_per_core_s_1_thread']:,.0f} (the bound uses the better)")
        if fpe > 1 and name in ("env", "sample", "train"):
            lines.append(f"{'':<7} {'  frames/s (x' + str(fpe) + ' frames per env step)':<38} "
                         f"{headline_rate(st[key]) * fpe:>10,.0f}")
    if any(name in stages for name in ("sample", "train")):
        lines.append("rate: median of the windows; sample (env steps sampled) and train (env steps trained on): "
                     "over the whole measurement, as their counters move a batch at a time")
    bound, eff = result["bound"], result["efficiency"]
    if "train_env_steps_per_s" in bound:
        lines.append(f"machine bound (train): {bound['train_env_steps_per_s']:,.0f} env steps/s = "
                     f"{bound['cores']} / (1/env + 1/infer + epochs/learn)")
    if "sample_env_steps_per_s" in bound:
        lines.append(f"machine bound (sample): {bound['sample_env_steps_per_s']:,.0f} env steps/s = "
                     f"{bound['cores']} / (1/env + 1/infer)")
    rounds = result.get("rounds")
    for stage, value in eff.items():
        per_round = (f", the median of {len(rounds)} rounds' own ratios ("
                     + ", ".join(f"{r['efficiency'][stage]:.0%}" for r in rounds) + ")") if rounds else ""
        lines.append(f"efficiency ({stage} / bound): {value:.0%}{per_round}")
    for name in ("sample", "train"):
        if name not in stages:
            continue
        st = stages[name]
        lag = st["policy_lag"]
        procs = ", ".join(f"{p['name'].removeprefix('fastrl-')} {p['cpu_percent']:.0f}% {p['pss_mib']:.0f} MiB"
                          for p in st["processes"])
        which = f" (round {result['stage_rounds'][name]})" if result.get("stage_rounds") else ""
        lines += [f"{name}{which}: {st['bottleneck']}",
                  f"  learner busy {st['learner_busy_fraction']:.0%} / waiting {st['learner_wait_fraction']:.0%}"
                  + ("" if st.get("learner_wait_cores_idle_fraction") is None else
                     f" (the cores idle {st['learner_wait_cores_idle_fraction']:.0%} of that time)")
                  + ("" if st.get("learner_parallel_fraction") is None else
                     f" (all its threads on {st['learner_parallel_fraction']:.0%} of its minibatches)") + "; "
                  f"inference batch {st['inference_mean_batch']:.0f}; policy lag p50/p95/max "
                  f"{lag['p50']}/{lag['p95']}/{lag['max']}; dropped for lag {st['samples_dropped_for_lag']:,}",
                  f"  per process (CPU %, PSS): {procs}"
                  + ("" if st.get("rollout_pinned_fraction") is None else
                     f"; rollout workers pinned {st['rollout_pinned_fraction']:.0%} of the time"),
                  f"  peak total PSS {st['peak_total_pss_mib']:,.0f} MiB (summed RSS {st['peak_total_rss_mib']:,.0f} MiB); "
                  f"first sample {st['time_to_first_sample_s']:.1f} s"
                  + ("" if st.get("time_to_first_batch_s") is None else
                     f", first batch {'freed' if name == 'sample' else 'trained'} {st['time_to_first_batch_s']:.1f} s")
                  + " after launching the runner (imports not counted)"]
        if st.get("cpu_costs"):
            lines.append(cost_line(st["cpu_costs"]))
        if st.get("core_shares"):
            lines.append(core_shares_line(st["core_shares"]))
    lines += rounds_lines(result)
    if result.get("bottleneck"):
        lines.append(f"bottleneck: {result['bottleneck']}")
    return "\n".join(lines)


ROLE_NAMES = {"rollout": "rollout workers", "inference": "inference", "learner": "learner"}


def cost_line(costs: dict) -> str:
    """cpu_costs in one line: each role's run / bound CPU µs per env step (3 significant digits, from
    Pong's hundreds to CartPole's few), and the two factors."""
    run, bound = costs["run_ms"], costs["bound_ms"]
    roles = [r for r in ROLE_NAMES if r in run or r in bound] + sorted(set(run) - set(ROLE_NAMES))

    def us(ms: float) -> str:
        return f"{ms * 1e3:.3g}" if ms * 1e3 < 1000 else f"{ms * 1e3:,.0f}"
    parts = ", ".join(f"{ROLE_NAMES.get(r, r)} {us(run.get(r, 0.0))} / {us(bound.get(r, 0.0))}" for r in roles)
    return (f"  CPU µs per env step, run / bound: {parts}; all {us(sum(run.values()))} / {us(sum(bound.values()))}"
            f" -> bound/run {costs['cost_ratio']:.0%} x cores used {costs['cores_used_fraction']:.0%}"
            f" = {costs['cost_ratio'] * costs['cores_used_fraction']:.1%} of the bound")


def core_shares_line(shares: dict) -> str:
    """Where the cores' time went over a system stage's window (fastrl.bench.measure.core_shares)."""
    return (f"  the cores' time: this run's processes {shares['ours']:.0%}, other processes {shares['other']:.0%}, "
            f"idle {shares['idle']:.0%}, stolen by the hypervisor {shares['stolen']:.0%}"
            + (f" (the rate is per wall second, the bound per CPU second: the stolen time given back "
               f"would raise the efficiency at most {1 / (1 - shares['stolen']):.2f}x)" if shares["stolen"] >= 0.005 else ""))


class Progress:
    """One status line per stage: rewritten in place on a terminal, every few seconds otherwise."""

    def __init__(self, stream=None, every_s: float = 5.0):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.every_s = every_s
        self.stage = ""
        self.last = 0.0

    def begin(self, index: int, total: int, stage: str) -> None:
        self.stage = f"[{index}/{total}] {stage}" if total else f"[{index}] {stage}"
        self.last = 0.0

    def __call__(self, fraction: float, text: str) -> None:
        now = time.monotonic()
        if not self.tty and now - self.last < self.every_s:
            return
        self.last = now
        bar = "#" * int(20 * fraction) + "." * (20 - int(20 * fraction))
        line = f"{self.stage} [{bar}] {text}"
        if self.tty:
            self.stream.write("\r" + line[:120].ljust(120))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def end(self, text: str) -> None:
        self.stream.write(("\r" if self.tty else "") + f"{self.stage}: {text}".ljust(120 if self.tty else 0) + "\n")
        self.stream.flush()


def learner_setup(cfg, trainer) -> str:
    """How a preset's learner runs, for a learner A/B's first line: its precision, shards and split."""
    return (f"{cfg.model.precision}, {cfg.system.learner_shards} shard(s) of {cfg.system.learner_threads} "
            f"thread(s), split {trainer.split}")


def learner_ab_lines(config: str, isa: str, spent: dict[str, list[float]], before: str, after: str,
                     threads: str = "1 thread") -> list[str]:
    """What a microbenchmark's learner A/B (fastrl.bench.measure.alternated_learner_cpu_ms) prints: the
    median CPU ms per batch of `before` and `after`, and before/after per pair of rounds (> 1: after is cheaper)."""
    ratios = [a / b for a, b in zip(spent[before], spent[after])]
    return [f"{config}: learner CPU ms per batch, {threads}, ISA {isa}: {before} "
            f"{statistics.median(spent[before]):.2f}, {after} {statistics.median(spent[after]):.2f}",
            f"{before}/{after} per pair of rounds: {' '.join(f'{x:.2f}' for x in ratios)}; "
            f"median {statistics.median(ratios):.3f}"]
