//! The app behind `idem-proxy`: the same routes, written in another
//! language and run as a child process; the proxy serves in this process.
//! `Adapter::ProxyTls` reaches the Python upstream over `https://`,
//! through a TLS terminator in this process presenting a test CA's
//! certificate for `localhost`.

use std::net::SocketAddr;
use std::sync::Arc;

use http::HeaderName;
use idem_http::Options;
use idem_proxy::{Proxy, Route, UpstreamTls, UpstreamUrl};
use idem_testing::tls::{self, Certs, ServerCert};
use idem_testing::upstream::Upstream;
use tokio::net::{TcpListener, TcpStream};

use crate::Scope;

/// Serves the proxy in front of `upstream` on a free port; the upstream
/// process lives as long as the proxy (until the case's runtime ends).
pub(crate) async fn serve(options: Options, scope: Scope, upstream: Arc<Upstream>) -> SocketAddr {
    let url = upstream.url().parse().unwrap();
    serve_to(options, scope, upstream, url, UpstreamTls::default()).await
}

/// As [`serve`], the proxy reaching `upstream` over `https://localhost`,
/// checked against a CA made for the case.
pub(crate) async fn serve_over_tls(
    options: Options,
    scope: Scope,
    upstream: Arc<Upstream>,
) -> SocketAddr {
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::new(dir.path());
    let trust = UpstreamTls::with_ca_file(&certs.path("ca.pem")).unwrap();
    let terminator = terminate_tls(&certs, upstream.url()).await;
    let url = format!("https://localhost:{}", terminator.port())
        .parse()
        .unwrap();
    serve_to(options, scope, upstream, url, trust).await
}

async fn serve_to(
    options: Options,
    scope: Scope,
    upstream: Arc<Upstream>,
    url: UpstreamUrl,
    trust: UpstreamTls,
) -> SocketAddr {
    let mut route = Route::new(options);
    if scope == Scope::TenantHeader {
        route = route.with_scope(idem_proxy::Scope::Header {
            name: HeaderName::from_static("x-tenant"),
            hash: false,
        });
    }
    let proxy = Proxy::builder(url).upstream_tls(trust).route(route).build();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        proxy.serve(listener, std::future::pending()).await;
        drop(upstream);
    });
    addr
}

/// Accepts TLS with the good server certificate of `certs` on a free
/// port and relays each connection's bytes to `upstream` (`http://…`):
/// a connection the upstream breaks breaks here too, as the proxy must
/// see it.
async fn terminate_tls(certs: &Certs, upstream: String) -> SocketAddr {
    let target = upstream.trim_start_matches("http://").to_owned();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let config = tls::rustls_server_config(certs, ServerCert::Good);
    tls::serve_tls(listener, config, move |mut outside| {
        let target = target.clone();
        async move {
            let Ok(mut inside) = TcpStream::connect(&target).await else {
                return;
            };
            let _ = inside.set_nodelay(true);
            let _ = tokio::io::copy_bidirectional(&mut outside, &mut inside).await;
        }
    });
    addr
}
