"""The admin calls (an admin API key): nodes, tenants, quotas and keys, for
:class:`libdsec.Client` and :class:`libdsec.AsyncClient`. Nodes and tenants
come back as dataclasses of :mod:`libdsec.models` (:class:`Node`,
:class:`Tenant`, ...), which also read as the API's JSON objects
(``node["state"]``; see docs/api.md). Nothing here sends
a request by itself: the clients' ``_json`` and ``_send`` do."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List
from urllib.parse import quote

from . import _ops
from .models import Admission, APIKey, Node, Tenant


def _create_tenant(name: str) -> _ops.Req:
    return _ops.jreq("POST", "/v1/tenants", {"name": name})


def _create_key(tenant: str, admin: bool) -> _ops.Req:
    return _ops.jreq("POST", _ops.tenant_path(tenant, "keys"), {"admin": admin})


def _delete_key(key_id: str) -> _ops.Req:
    return _ops.jreq("DELETE", "/v1/keys/" + quote(key_id, safe=""))


class AdminCalls:
    """The admin calls of :class:`libdsec.Client`."""

    if TYPE_CHECKING:
        def _json(self, req: _ops.Req) -> Any: ...

    def nodes(self) -> List[Node]:
        """Nodes with capacity and allocation (admin key)."""
        return [Node.from_json(d) for d in self._json(_ops.jreq("GET", "/v1/nodes"))["nodes"]]

    def admission(self) -> Admission:
        """The answering server's admission queue (admin key): creates that
        wait because every node with room for them is busy (``waiting``,
        ``tenants``, ``oldest_wait_ms``, ``admitted``, ``timed_out``,
        ``left``, ``max_cpu_load``)."""
        return Admission.from_json(self._json(_ops.jreq("GET", "/v1/nodes")).get("admission") or {})

    def node(self, node_id: str) -> Node:
        """One node (admin key); :class:`NotFoundError` if there is none."""
        return Node.from_json(self._json(_ops.jreq("GET", _ops.node_path(node_id))))

    def drain_node(self, node_id: str) -> Node:
        """Stops a node from taking new sandboxes; those on it keep running
        (admin key). Returns the node, its ``state`` ``"draining"``."""
        return Node.from_json(self._json(_ops.drain(node_id, True)))

    def undrain_node(self, node_id: str) -> Node:
        """Lets a drained node take new sandboxes again (admin key)."""
        return Node.from_json(self._json(_ops.drain(node_id, False)))

    def create_tenant(self, name: str) -> Tenant:
        """Creates a tenant (admin key)."""
        return Tenant.from_json(self._json(_create_tenant(name)))

    def tenants(self) -> List[Tenant]:
        """Lists tenants (admin key)."""
        return [Tenant.from_json(d) for d in self._json(_ops.jreq("GET", "/v1/tenants"))["tenants"]]

    def tenant(self, tenant_id: str) -> Tenant:
        """One tenant with its ``quota`` and ``usage`` (admin key)."""
        return Tenant.from_json(self._json(_ops.jreq("GET", _ops.tenant_path(tenant_id))))

    def set_quota(self, tenant_id: str, *, sandboxes: int = 0, cpu: float = 0, memory_mb: int = 0) -> Tenant:
        """Replaces a tenant's quota on its live sandboxes (admin key); a
        field left at 0 is unlimited. Sandboxes already over a lowered quota
        keep running; creates past it raise :class:`ResourceExhaustedError`.
        Returns the tenant with its ``quota`` and ``usage``."""
        return Tenant.from_json(self._json(_ops.set_quota(tenant_id, sandboxes, cpu, memory_mb)))

    def create_key(self, tenant: str, *, admin: bool = False) -> str:
        """Creates an API key for a tenant and returns it (shown only once)."""
        return self._json(_create_key(tenant, admin))["secret"]

    def keys(self, tenant: str) -> List[APIKey]:
        """Lists a tenant's keys, without secrets (admin key)."""
        return [APIKey.from_json(d) for d in self._json(_ops.jreq("GET", _ops.tenant_path(tenant, "keys")))["keys"]]

    def delete_key(self, key_id: str) -> None:
        """Revokes a key (admin key)."""
        self._json(_delete_key(key_id))


class AsyncAdminCalls:
    """The admin calls of :class:`libdsec.AsyncClient`; see :class:`AdminCalls`."""

    if TYPE_CHECKING:
        async def _json(self, req: _ops.Req) -> Any: ...

    async def nodes(self) -> List[Node]:
        """Nodes with capacity and allocation (admin key)."""
        return [Node.from_json(d) for d in (await self._json(_ops.jreq("GET", "/v1/nodes")))["nodes"]]

    async def admission(self) -> Admission:
        """The answering server's admission queue (admin key); see :meth:`AdminCalls.admission`."""
        return Admission.from_json((await self._json(_ops.jreq("GET", "/v1/nodes"))).get("admission") or {})

    async def node(self, node_id: str) -> Node:
        """One node (admin key)."""
        return Node.from_json(await self._json(_ops.jreq("GET", _ops.node_path(node_id))))

    async def drain_node(self, node_id: str) -> Node:
        """Stops a node from taking new sandboxes (admin key)."""
        return Node.from_json(await self._json(_ops.drain(node_id, True)))

    async def undrain_node(self, node_id: str) -> Node:
        """Lets a drained node take new sandboxes again (admin key)."""
        return Node.from_json(await self._json(_ops.drain(node_id, False)))

    async def create_tenant(self, name: str) -> Tenant:
        """Creates a tenant (admin key)."""
        return Tenant.from_json(await self._json(_create_tenant(name)))

    async def tenants(self) -> List[Tenant]:
        """Lists tenants (admin key)."""
        return [Tenant.from_json(d) for d in (await self._json(_ops.jreq("GET", "/v1/tenants")))["tenants"]]

    async def tenant(self, tenant_id: str) -> Tenant:
        """One tenant with its quota and usage (admin key)."""
        return Tenant.from_json(await self._json(_ops.jreq("GET", _ops.tenant_path(tenant_id))))

    async def set_quota(self, tenant_id: str, *, sandboxes: int = 0, cpu: float = 0,
                        memory_mb: int = 0) -> Tenant:
        """Replaces a tenant's quota (admin key); see :meth:`libdsec.Client.set_quota`."""
        return Tenant.from_json(await self._json(_ops.set_quota(tenant_id, sandboxes, cpu, memory_mb)))

    async def create_key(self, tenant: str, *, admin: bool = False) -> str:
        """Creates an API key for a tenant and returns it (shown only once)."""
        return (await self._json(_create_key(tenant, admin)))["secret"]

    async def keys(self, tenant: str) -> List[APIKey]:
        """Lists a tenant's keys, without secrets (admin key)."""
        return [APIKey.from_json(d) for d in (await self._json(_ops.jreq("GET", _ops.tenant_path(tenant, "keys"))))["keys"]]

    async def delete_key(self, key_id: str) -> None:
        """Revokes a key (admin key)."""
        await self._json(_delete_key(key_id))
