"""Offline datasets: device tensors, cards, Minari and D4RL-style HDF5 readers and writers."""

from robotrl.data.dataset import FIELDS, Dataset, DatasetCard, DatasetError
from robotrl.data.io import (
           datasets_root,
           load_card,
           load_dataset,
           load_hdf5,
           save_hdf5,
           save_minari,
)

__all__ = ["FIELDS", "Dataset", "DatasetCard", "DatasetError", "datasets_root", "load_card",
           "load_dataset", "load_hdf5", "save_hdf5", "save_minari"]
