//! The app behind `idem-proxy`: the same routes, written in another
//! language and run as a child process; the proxy serves in this process.

use std::net::SocketAddr;
use std::sync::Arc;

use http::HeaderName;
use idem_http::Options;
use idem_proxy::{Proxy, Route};
use idem_testing::upstream::Upstream;
use tokio::net::TcpListener;

use crate::Scope;

/// Serves the proxy in front of `upstream` on a free port; the upstream
/// process lives as long as the proxy (until the case's runtime ends).
pub(crate) async fn serve(options: Options, scope: Scope, upstream: Arc<Upstream>) -> SocketAddr {
    let mut route = Route::new(options);
    if scope == Scope::TenantHeader {
        route = route.with_scope(idem_proxy::Scope::Header {
            name: HeaderName::from_static("x-tenant"),
            hash: false,
        });
    }
    let proxy = Proxy::builder(upstream.url().parse().unwrap())
        .route(route)
        .build();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        proxy.serve(listener, std::future::pending()).await;
        drop(upstream);
    });
    addr
}
