"""The compute tests use the loopback fleets of the tuning tests and the inventory of the loader's
tests; each module that needs a Ray cluster starts its own (`ray_clusters.connected_cluster`)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "tune"))
sys.path.insert(0, str(Path(__file__).parents[1] / "inventory"))
