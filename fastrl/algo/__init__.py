"""The learning algorithm as pure tensor functions: V-trace targets and the APPO loss."""

from fastrl.algo.appo_loss import LossOutput, appo_loss, masked_mean
from fastrl.algo.vtrace import VTraceReturns, vtrace

__all__ = ["LossOutput", "VTraceReturns", "appo_loss", "masked_mean", "vtrace"]
