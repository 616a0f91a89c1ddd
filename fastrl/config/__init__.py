"""Configuration: the typed schema, YAML/--set loading, and cross-field checks."""

from fastrl.config.checks import check_config
from fastrl.config.loader import ConfigError, config_from_dict, config_to_dict, load_config
from fastrl.config.schema import Config

__all__ = ["Config", "ConfigError", "check_config", "config_from_dict", "config_to_dict", "load_config"]
