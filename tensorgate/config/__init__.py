"""Server and model configuration: schema, YAML loading, defaults, clear errors."""

from tensorgate.config.model_config import DynamicBatching, InstanceGroup, ModelConfig, WarmupSample
from tensorgate.config.server_config import ServerConfig, ServerSection

__all__ = ["DynamicBatching", "InstanceGroup", "ModelConfig", "ServerConfig", "ServerSection", "WarmupSample"]
