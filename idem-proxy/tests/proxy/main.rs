//! The proxy over real sockets in front of upstreams written in Python:
//! its own behaviour (upstream failures, routes, scope, h2c, shutdown,
//! admin), a stampede of duplicates, the binary killed under load, and
//! TLS to the upstream and on the listener.

mod crash;
mod stampede;
mod support;
#[cfg(feature = "tls")]
mod tls;
mod upstream;
