"""mstar: a serving system for composite generative models.

Importing mstar is cheap: no torch, no CUDA. Heavy modules are imported where they are used.
"""

__version__ = "0.1.0"
