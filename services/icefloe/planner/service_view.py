"""What the write routes use of the planner that serves them.

:class:`icefloe.planner.app.PlannerService` imports the write routes, not the reverse: they
see it through this protocol.
"""

from __future__ import annotations

from typing import Protocol

from prometheus_client import CollectorRegistry

from icefloe.manifests.cache import ManifestCache
from icefloe.planner.config import PlannerConfig
from icefloe.planner.delegation import AccessDelegation
from icefloe.planner.refresher import TableRefresher
from icefloe.table.catalog import Catalog


class PlannerService(Protocol):
    """What the write routes use of the planner that serves them."""

    @property
    def config(self) -> PlannerConfig: ...

    @property
    def catalog(self) -> Catalog: ...

    @property
    def refresher(self) -> TableRefresher: ...

    @property
    def cache(self) -> ManifestCache: ...

    @property
    def registry(self) -> CollectorRegistry: ...

    @property
    def delegation(self) -> AccessDelegation: ...
