"""The learning algorithm as pure tensor functions: V-trace targets, the APPO loss, the optimisation
pass and reward scaling. Import the submodule you need (fastrl.algo.vtrace, ...): the package
itself imports nothing, so that the numpy-only reward scaler does not pull torch into a rollout
worker."""
