"""robotrl: robotics and continuous-control RL on one PyTorch core."""

__version__ = "0.1.0"
