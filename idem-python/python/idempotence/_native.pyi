"""Type stubs of the native module (Rust, PyO3)."""

from typing import Any, Awaitable, Iterable, List, Optional, Sequence, Tuple, Type, Union

class Store:
    """A store named by URL, opened lazily in each process."""

    @property
    def url(self) -> str:
        """The store's URL, without its password."""

    @property
    def near_cache(self) -> bool:
        """Whether replays of settled records are answered from this process."""

def open_store(url: str, *, name: Optional[str] = None, near_cache: bool = False) -> Store:
    """Names a store by URL: ``memory``, ``sqlite:PATH``, ``redis://…``,
    ``rediss://…``, ``postgres://…``, ``mysql://…`` or ``mariadb://…``.

    ``name`` is a Redis key prefix or a SQL table (created if missing).
    Nothing is opened until the first call that uses the store, in each
    process, so a server may fork its workers after importing the app.
    Raises ``ValueError`` for a URL of no known store.

    ``near_cache=True`` keeps settled records in each process (idem-core's
    ``NearCache``: 10,000 records, 16 MiB, 60 s at most), so a replay needs
    no round trip. A record deleted by hand may replay for up to 60 s more.
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

Headers = Iterable[Tuple[bytes, bytes]]

class FingerprintPolicy:
    """What a request's fingerprint covers (idem-http's policy).

    ``include`` counts only the values at these JSON Pointers (or form
    fields and multipart parts of these names); ``exclude`` counts all but
    them; ``ignore_query`` leaves the query out, ``ignore_query_params``
    the parameters of these names. Raises ``ValueError`` for a pointer that
    is neither empty nor starts with ``/``, or for both include and
    exclude.
    """

    def __init__(
        self,
        *,
        include: Optional[Sequence[str]] = None,
        exclude: Optional[Sequence[str]] = None,
        ignore_query: bool = False,
        ignore_query_params: Optional[Sequence[str]] = None,
    ) -> None: ...

class Answer:
    """A response for the middleware to send (internal)."""

    @property
    def status(self) -> int: ...
    @property
    def headers(self) -> List[Tuple[bytes, bytes]]: ...
    @property
    def whole(self) -> Optional[bytes]: ...
    def next(self) -> Awaitable[Optional[bytes]]: ...

class Run:
    """The application's run the exchange waits for (internal)."""

    def respond(self, status: int, headers: Headers) -> bool: ...
    def send(self, frame: bytes) -> Union[bool, Awaitable[bool]]: ...
    def end(self) -> None: ...
    def fail(self, message: str) -> None: ...
    def abort(self) -> None: ...
    def answer(self) -> Awaitable[Optional[Answer]]: ...

class HttpOptions:
    """idem-http's options over a store (internal; see IdempotencyMiddleware)."""

    def __init__(
        self,
        store: Store,
        *,
        namespace: Optional[str] = None,
        lease: Optional[float] = None,
        retention: Optional[float] = None,
        header: Optional[str] = None,
        require_key: Optional[bool] = None,
        methods: Optional[Sequence[str]] = None,
        max_request_body: Optional[int] = None,
        max_response_body: Optional[int] = None,
        max_streamed_body: Optional[int] = None,
        record_server_errors: Optional[bool] = None,
        fail_open: Optional[bool] = None,
        store_timeout: Optional[float] = None,
        max_wait: Optional[float] = None,
        shared_across_callers: bool = False,
        check_unscoped_records: Optional[bool] = None,
        key_pointer: Optional[str] = None,
        policy: Optional[FingerprintPolicy] = None,
        routes: Optional[Sequence[Tuple[str, FingerprintPolicy]]] = None,
    ) -> None: ...
    @property
    def max_request_body(self) -> int: ...
    def admits(self, method_name: str, headers: Headers) -> bool: ...
    def start(
        self,
        method_name: str,
        target: bytes,
        headers: Headers,
        body: bytes,
        scope: Optional[str] = None,
    ) -> Awaitable[Union[None, Answer, Run]]: ...
