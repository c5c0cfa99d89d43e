//! The TLS files a broker URL names in its query: the CA to trust and a
//! client certificate, turned into one rustls configuration on ring.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::BrokerError;

/// The names of a broker's three file parameters, as its own tools spell
/// them: CA, client certificate, client key.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Names {
    pub(crate) ca: &'static str,
    pub(crate) cert: &'static str,
    pub(crate) key: &'static str,
}

/// The file parameters found in a URL's query, by name, and whatever else
/// it held.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Split {
    /// The URL without the file parameters (and without `?` if nothing
    /// else was left).
    pub(crate) url: String,
    /// `(name, value)` of the parameters taken off, in `names`.
    pub(crate) taken: Vec<(String, String)>,
}

impl Split {
    /// The value of parameter `name`, if the URL gave it.
    pub(crate) fn value(&self, name: &str) -> Option<&str> {
        self.taken
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Takes the parameters named `wanted` off `url`'s query. The rest of the
/// URL, fragment included, is left as it was.
pub(crate) fn split(url: &str, wanted: &[&str]) -> Split {
    let (rest, fragment) = match url.split_once('#') {
        Some((rest, fragment)) => (rest, Some(fragment)),
        None => (url, None),
    };
    let Some((base, query)) = rest.split_once('?') else {
        return Split {
            url: url.to_owned(),
            taken: Vec::new(),
        };
    };
    let mut taken = Vec::new();
    let mut kept = form_urlencoded::Serializer::new(String::new());
    let mut any_kept = false;
    for (name, value) in form_urlencoded::parse(query.as_bytes()) {
        if wanted.contains(&name.as_ref()) {
            taken.push((name.into_owned(), value.into_owned()));
        } else {
            kept.append_pair(&name, &value);
            any_kept = true;
        }
    }
    let mut url = base.to_owned();
    if any_kept {
        url.push('?');
        url.push_str(&kept.finish());
    }
    if let Some(fragment) = fragment {
        url.push('#');
        url.push_str(fragment);
    }
    Split { url, taken }
}

/// A rustls client configuration on ring: the CA named by `names.ca` (else
/// Mozilla's roots, from webpki-roots), and the client certificate and
/// key named by `names.cert` and `names.key` if both are given.
pub(crate) fn client_config(
    broker: &'static str,
    split: &Split,
    names: Names,
) -> Result<rustls::ClientConfig, BrokerError> {
    let bad = |name: &'static str, problem: String| {
        BrokerError::Config(format!(
            "{broker}: `{name}={}` {problem}",
            split.value(name).unwrap_or_default()
        ))
    };
    let mut roots = rustls::RootCertStore::empty();
    match split.value(names.ca) {
        Some(path) => {
            let certs = certificates(path).map_err(|e| bad(names.ca, e))?;
            for cert in certs {
                roots
                    .add(cert)
                    .map_err(|e| bad(names.ca, format!("holds a bad certificate: {e}")))?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| BrokerError::broker(broker, e))?
        .with_root_certificates(roots);
    match (split.value(names.cert), split.value(names.key)) {
        (None, None) => Ok(builder.with_no_client_auth()),
        (Some(cert), Some(key)) => {
            let chain = certificates(cert).map_err(|e| bad(names.cert, e))?;
            let key = PrivateKeyDer::from_pem_file(Path::new(key))
                .map_err(|e| bad(names.key, format!("holds no private key: {e}")))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| bad(names.key, format!("does not fit the certificate: {e}")))
        }
        _ => Err(BrokerError::Config(format!(
            "{broker}: a client certificate needs both `{}=FILE` and `{}=FILE`",
            names.cert, names.key
        ))),
    }
}

/// Every certificate in the PEM file at `path`; at least one.
fn certificates(path: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(Path::new(path))
        .map_err(|e| Unreadable(e).to_string())?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Unreadable(e).to_string())?;
    if certs.is_empty() {
        return Err("holds no PEM certificate".to_owned());
    }
    Ok(certs)
}

/// A PEM file that could not be read, worded for the sentence
/// "`name=path` cannot be read: …".
struct Unreadable(rustls::pki_types::pem::Error);

impl fmt::Display for Unreadable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            rustls::pki_types::pem::Error::Io(e) => write!(f, "cannot be read: {e}"),
            other => write!(f, "is not PEM: {other:?}"),
        }
    }
}

/// `scheme://user:secret@host…` → `scheme://user:***@host…`, for every
/// server of a comma-separated list.
pub(crate) fn redact(url: &str) -> String {
    url.split(',')
        .map(|one| {
            let Some((scheme, rest)) = one.split_once("://") else {
                return one.to_owned();
            };
            let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            let Some(at) = rest[..end].rfind('@') else {
                return one.to_owned();
            };
            match rest[..at].split_once(':') {
                Some((user, _)) => format!("{scheme}://{user}:***{}", &rest[at..]),
                None => one.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMES: Names = Names {
        ca: "tlsca",
        cert: "tlscert",
        key: "tlskey",
    };

    #[test]
    fn the_files_come_off_the_query_and_the_rest_stays() {
        let split = split(
            "tls://u:p@h:1?tlsca=%2Fa%20b.pem&tls=true&tlscert=c&tlskey=k#f",
            &[NAMES.ca, NAMES.cert, NAMES.key],
        );
        assert_eq!(split.url, "tls://u:p@h:1?tls=true#f");
        assert_eq!(split.value("tlsca"), Some("/a b.pem"));
        assert_eq!(split.value("tlskey"), Some("k"));
        assert_eq!(super::split("nats://h", &["tlsca"]).url, "nats://h");
        assert_eq!(super::split("nats://h?tlsca=x", &["tlsca"]).url, "nats://h");
    }

    #[test]
    fn bad_files_are_configuration_errors_naming_the_parameter() {
        for (query, named) in [
            ("tlsca=/nonexistent/ca.pem", "tlsca"),
            ("tlsca=/dev/null", "tlsca"),
            (
                "tlscert=/nonexistent/c.pem&tlskey=/nonexistent/c.key",
                "tlscert",
            ),
            ("tlscert=/dev/null", "tlskey"),
        ] {
            let url = format!("tls://u:hunter2@h:1?{query}");
            let split = split(&url, &[NAMES.ca, NAMES.cert, NAMES.key]);
            let error = client_config("nats", &split, NAMES).unwrap_err();
            let text = error.to_string();
            assert!(matches!(error, BrokerError::Config(_)), "{text}");
            assert!(text.contains(named), "{query}: {text}");
            assert!(!text.contains("hunter2"), "{text}");
        }
    }

    #[test]
    fn passwords_are_redacted_in_every_server() {
        assert_eq!(
            redact("nats://a:pw@h1:4222,nats://b:pw@h2?x=1"),
            "nats://a:***@h1:4222,nats://b:***@h2?x=1"
        );
        assert_eq!(redact("amqps://guest@h/%2f"), "amqps://guest@h/%2f");
        assert_eq!(redact("h:1"), "h:1");
    }
}
