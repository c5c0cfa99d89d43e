//! idem-tower over real HTTP: an axum app on 127.0.0.1, a real client, and
//! every store listed in `support::backends`.

mod cases;
mod faults;
mod plain_hyper;
mod support;
