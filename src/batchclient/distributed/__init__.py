"""Engine replicas on a Ray cluster: :class:`RayBatchInference` (guide: ``docs/scale-out.md``).

Importing this package does not import Ray; the provider imports it when it starts.
"""

from ._options import RayOptions
from ._provider import RayBatchInference, RayProvider

__all__ = [
    "RayBatchInference",
    "RayOptions",
    "RayProvider",
]
