//! A small HTTP client for the payments API's reads, on hyper; payments
//! themselves go through `idem-client`, which retries them.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::ledger::Charge;

/// A request to the payments API that did not produce a usable answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The base URL or a key cannot be used in a request.
    #[error("cannot build the request: {0}")]
    Request(#[from] http::Error),
    /// The connection failed or broke.
    #[error("request failed: {0}")]
    Connection(#[from] hyper_util::client::legacy::Error),
    /// The response body broke off.
    #[error("response body failed: {0}")]
    Body(#[from] hyper::Error),
    /// No complete response came within the client's timeout.
    #[error("no response within {0:?}")]
    TimedOut(Duration),
    /// The server answered with a status this call does not expect.
    #[error("unexpected status {0}")]
    Status(StatusCode),
    /// The body is not the JSON expected.
    #[error("response does not decode: {0}")]
    Decode(#[from] serde_json::Error),
}

/// A complete response.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    body: Bytes,
}

/// A pooled HTTP/1 client bound to one server.
#[derive(Debug, Clone)]
pub(crate) struct PaymentsClient {
    client: Client<HttpConnector, Full<Bytes>>,
    base: String,
}

impl PaymentsClient {
    pub(crate) fn new(base: &str, pool: usize) -> PaymentsClient {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(pool)
            .build(connector);
        PaymentsClient {
            client,
            base: base.trim_end_matches('/').to_owned(),
        }
    }

    /// `GET path`, expecting a 200 with a JSON body.
    pub(crate) async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        timeout: Duration,
    ) -> Result<T, ClientError> {
        let request = Request::builder()
            .uri(self.uri(path)?)
            .body(Full::new(Bytes::new()))?;
        let answer = self.send(request, timeout).await?;
        if answer.status != StatusCode::OK {
            return Err(ClientError::Status(answer.status));
        }
        Ok(serde_json::from_slice(&answer.body)?)
    }

    /// Every charge the server made, from `GET /payments`.
    pub(crate) async fn charges(&self, timeout: Duration) -> Result<Vec<Charge>, ClientError> {
        #[derive(serde::Deserialize)]
        struct ChargeList {
            charges: Vec<Charge>,
        }
        let list: ChargeList = self.get_json("/payments", timeout).await?;
        Ok(list.charges)
    }

    fn uri(&self, path: &str) -> Result<Uri, http::Error> {
        Ok(format!("{}{path}", self.base).parse::<Uri>()?)
    }

    async fn send(
        &self,
        request: Request<Full<Bytes>>,
        timeout: Duration,
    ) -> Result<Answer, ClientError> {
        let exchange = async {
            let response = self.client.request(request).await?;
            let (parts, body) = response.into_parts();
            let body = body.collect().await?.to_bytes();
            Ok::<_, ClientError>((parts, body))
        };
        let (parts, body) = tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| ClientError::TimedOut(timeout))??;
        Ok(Answer {
            status: parts.status,
            body,
        })
    }
}
