"""The benchmark harness: declared grids of ordinary run directories, and reports computed
from run directories alone."""
