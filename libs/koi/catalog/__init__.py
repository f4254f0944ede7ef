"""The catalog: accelerators, cloud offerings, model architectures and inference engines.

Typed records (``types``) loaded from the YAML files in ``catalog/data/`` by ``loader``,
each with the source of its figures. ``load_catalog()`` returns the validated ``Catalog``;
unknown ids raise ``CatalogError`` (a ``KeyError``) that names the closest known ids.
This package holds data and lookups only: no pricing policy, no prediction, and no
transport imports.
"""

from __future__ import annotations

from koi.catalog.loader import Catalog, CatalogError, load_catalog
from koi.catalog.types import Accelerator, Engine, Interconnect, Market, Model, Offering

__all__ = [
    "Accelerator",
    "Catalog",
    "CatalogError",
    "Engine",
    "Interconnect",
    "Market",
    "Model",
    "Offering",
    "load_catalog",
]
