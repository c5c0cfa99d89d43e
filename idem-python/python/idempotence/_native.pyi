"""Type stubs of the native module (Rust, PyO3)."""

from typing import Any, Awaitable, Optional, Tuple, Type

class Store:
    """A store named by URL, opened lazily in each process."""

    @property
    def url(self) -> str:
        """The store's URL, without its password."""

def open_store(url: str, *, name: Optional[str] = None) -> Store:
    """Names a store by URL: ``memory``, ``sqlite:PATH``, ``redis://…``,
    ``rediss://…``, ``postgres://…``, ``mysql://…`` or ``mariadb://…``.

    ``name`` is a Redis key prefix or a SQL table (created if missing).
    Nothing is opened until the first call that uses the store, in each
    process, so a server may fork its workers after importing the app.
    Raises ``ValueError`` for a URL of no known store.
    """

class Call:
    """One call whose function runs under a lease (internal)."""

    def complete(self, value: Any) -> Any: ...
    def complete_async(self, value: Any) -> Awaitable[Any]: ...
    def fail(self, error: BaseException) -> Optional[str]: ...
    def fail_async(self, error: BaseException) -> Awaitable[Optional[str]]: ...

class Guard:
    """A decorated function's settings (internal)."""

    def __init__(
        self,
        store: Store,
        *,
        namespace: str,
        lease: float,
        retention: float,
        wait: Optional[float],
        remember: Tuple[Type[BaseException], ...],
    ) -> None: ...
    def begin(self, key: str, scope: str, body: Any) -> Tuple[bool, Any]: ...
    def begin_async(self, key: str, scope: str, body: Any) -> Awaitable[Tuple[bool, Any]]: ...
