"""The admin calls (an admin API key): nodes, tenants, quotas and keys, for
:class:`libdsec.Client` and :class:`libdsec.AsyncClient`. Nodes and tenants
come back as the API's JSON objects (see docs/api.md). Nothing here sends
a request by itself: the clients' ``_json`` and ``_send`` do."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List
from urllib.parse import quote

from . import _ops


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

    def nodes(self) -> List[Dict[str, Any]]:
        """Nodes with capacity and allocation (admin key)."""
        return self._json(_ops.jreq("GET", "/v1/nodes"))["nodes"]

    def admission(self) -> Dict[str, Any]:
        """The answering server's admission queue (admin key): creates that
        wait because every node with room for them is busy (``waiting``,
        ``tenants``, ``oldest_wait_ms``, ``admitted``, ``timed_out``,
        ``left``, ``max_cpu_load``)."""
        return self._json(_ops.jreq("GET", "/v1/nodes")).get("admission") or {}

    def node(self, node_id: str) -> Dict[str, Any]:
        """One node (admin key); :class:`NotFoundError` if there is none."""
        return self._json(_ops.jreq("GET", _ops.node_path(node_id)))

    def drain_node(self, node_id: str) -> Dict[str, Any]:
        """Stops a node from taking new sandboxes; those on it keep running
        (admin key). Returns the node, its ``state`` ``"draining"``."""
        return self._json(_ops.drain(node_id, True))

    def undrain_node(self, node_id: str) -> Dict[str, Any]:
        """Lets a drained node take new sandboxes again (admin key)."""
        return self._json(_ops.drain(node_id, False))

    def create_tenant(self, name: str) -> Dict[str, Any]:
        """Creates a tenant (admin key)."""
        return self._json(_create_tenant(name))

    def tenants(self) -> List[Dict[str, Any]]:
        """Lists tenants (admin key)."""
        return self._json(_ops.jreq("GET", "/v1/tenants"))["tenants"]

    def tenant(self, tenant_id: str) -> Dict[str, Any]:
        """One tenant with its ``quota`` and ``usage`` (admin key)."""
        return self._json(_ops.jreq("GET", _ops.tenant_path(tenant_id)))

    def set_quota(self, tenant_id: str, *, sandboxes: int = 0, cpu: float = 0, memory_mb: int = 0) -> Dict[str, Any]:
        """Replaces a tenant's quota on its live sandboxes (admin key); a
        field left at 0 is unlimited. Sandboxes already over a lowered quota
        keep running; creates past it raise :class:`ResourceExhaustedError`.
        Returns the tenant with its ``quota`` and ``usage``."""
        return self._json(_ops.set_quota(tenant_id, sandboxes, cpu, memory_mb))

    def create_key(self, tenant: str, *, admin: bool = False) -> str:
        """Creates an API key for a tenant and returns it (shown only once)."""
        return self._json(_create_key(tenant, admin))["secret"]

    def keys(self, tenant: str) -> List[Dict[str, Any]]:
        """Lists a tenant's keys, without secrets (admin key)."""
        return self._json(_ops.jreq("GET", _ops.tenant_path(tenant, "keys")))["keys"]

    def delete_key(self, key_id: str) -> None:
        """Revokes a key (admin key)."""
        self._json(_delete_key(key_id))


class AsyncAdminCalls:
    """The admin calls of :class:`libdsec.AsyncClient`; see :class:`AdminCalls`."""

    if TYPE_CHECKING:
        async def _json(self, req: _ops.Req) -> Any: ...

    async def nodes(self) -> List[Dict[str, Any]]:
        """Nodes with capacity and allocation (admin key)."""
        return (await self._json(_ops.jreq("GET", "/v1/nodes")))["nodes"]

    async def admission(self) -> Dict[str, Any]:
        """The answering server's admission queue (admin key); see :meth:`AdminCalls.admission`."""
        return (await self._json(_ops.jreq("GET", "/v1/nodes"))).get("admission") or {}

    async def node(self, node_id: str) -> Dict[str, Any]:
        """One node (admin key)."""
        return await self._json(_ops.jreq("GET", _ops.node_path(node_id)))

    async def drain_node(self, node_id: str) -> Dict[str, Any]:
        """Stops a node from taking new sandboxes (admin key)."""
        return await self._json(_ops.drain(node_id, True))

    async def undrain_node(self, node_id: str) -> Dict[str, Any]:
        """Lets a drained node take new sandboxes again (admin key)."""
        return await self._json(_ops.drain(node_id, False))

    async def create_tenant(self, name: str) -> Dict[str, Any]:
        """Creates a tenant (admin key)."""
        return await self._json(_create_tenant(name))

    async def tenants(self) -> List[Dict[str, Any]]:
        """Lists tenants (admin key)."""
        return (await self._json(_ops.jreq("GET", "/v1/tenants")))["tenants"]

    async def tenant(self, tenant_id: str) -> Dict[str, Any]:
        """One tenant with its quota and usage (admin key)."""
        return await self._json(_ops.jreq("GET", _ops.tenant_path(tenant_id)))

    async def set_quota(self, tenant_id: str, *, sandboxes: int = 0, cpu: float = 0,
                        memory_mb: int = 0) -> Dict[str, Any]:
        """Replaces a tenant's quota (admin key); see :meth:`libdsec.Client.set_quota`."""
        return await self._json(_ops.set_quota(tenant_id, sandboxes, cpu, memory_mb))

    async def create_key(self, tenant: str, *, admin: bool = False) -> str:
        """Creates an API key for a tenant and returns it (shown only once)."""
        return (await self._json(_create_key(tenant, admin)))["secret"]

    async def keys(self, tenant: str) -> List[Dict[str, Any]]:
        """Lists a tenant's keys, without secrets (admin key)."""
        return (await self._json(_ops.jreq("GET", _ops.tenant_path(tenant, "keys"))))["keys"]

    async def delete_key(self, key_id: str) -> None:
        """Revokes a key (admin key)."""
        await self._json(_delete_key(key_id))
