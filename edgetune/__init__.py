"""edgetune: tune neural networks per device class on a fleet of edge boards with Apache TVM."""

__version__ = "0.1.0"
