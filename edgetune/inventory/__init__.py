"""The fleet inventory: schema records and their validating YAML loader (pure data)."""

from edgetune.inventory.loader import load_fleet, load_profile
from edgetune.inventory.schema import (
    SCHEMA_VERSION,
    Board,
    DeviceClass,
    DeviceProfile,
    Fleet,
    Measurement,
    Model,
    ModelInput,
    Tracker,
    TuningPolicy,
)

__all__ = [
    "SCHEMA_VERSION",
    "Board",
    "DeviceClass",
    "DeviceProfile",
    "Fleet",
    "Measurement",
    "Model",
    "ModelInput",
    "Tracker",
    "TuningPolicy",
    "load_fleet",
    "load_profile",
]
