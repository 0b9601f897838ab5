"""The compute tests use the loopback fleets of the tuning tests (support.fleets) and the
loader's base inventory (support.inventory_files); each module that needs a Ray cluster starts
its own (`support.ray_clusters.connected_cluster`)."""
