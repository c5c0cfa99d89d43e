//! A password in a store's URL never shows: not in the errors of a store
//! that cannot be reached, refuses the URL's options or cannot read its
//! TLS files, not in their `Debug`, not in the URL displayed.

use idem_testing::StoreUrl;

const SECRET: &str = "hunter2-sEcReT";

/// `host:port` of a server the tests use, or `None` (skipped, with the
/// reason printed; a failure under `CI`).
fn address(server: idem_testing::Server) -> Option<String> {
    let url = server.require()?;
    let rest = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    Some(rest.split('/').next().unwrap_or(rest).to_owned())
}

/// URLs that fail to open, each with the password, on every server store:
/// a refused connection, a user the server does not know, TLS files that
/// do not exist, options the store does not take.
fn failing_urls() -> Vec<String> {
    use idem_testing::Server;
    let mut urls = vec![
        "redis://app:PW@127.0.0.1:1/0".to_owned(),
        "rediss://app:PW@127.0.0.1:1/0?cacert=/nonexistent/ca.pem".to_owned(),
        "postgres://app:PW@127.0.0.1:1/app?sslmode=sometimes".to_owned(),
        "mysql://app:PW@127.0.0.1:1/app?ssl-mode=sometimes".to_owned(),
    ];
    if let Some(redis) = address(Server::Redis) {
        urls.push(format!("redis://idem_nobody:PW@{redis}/0"));
        urls.push(format!("rediss://idem_nobody:PW@{redis}/0"));
    }
    if let Some(postgres) = address(Server::Postgres) {
        urls.push(format!("postgres://idem_nobody:PW@{postgres}/test"));
        urls.push(format!(
            "postgres://idem_nobody:PW@{postgres}/test?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem"
        ));
    }
    if let Some(mysql) = address(Server::MySql) {
        urls.push(format!("mysql://idem_nobody:PW@{mysql}/test"));
        urls.push(format!(
            "mariadb://idem_nobody:PW@{mysql}/test?ssl-mode=VERIFY_IDENTITY&ssl-ca=/nonexistent/ca.pem"
        ));
    }
    urls.iter().map(|url| url.replace("PW", SECRET)).collect()
}

#[tokio::test]
async fn no_error_shows_the_password() {
    for raw in failing_urls() {
        let url: StoreUrl = raw.parse().unwrap();
        let shown = format!("{url} {url:?}");
        assert!(!shown.contains(SECRET), "{shown}");
        assert!(shown.contains(":***@"), "{shown}");
        let error = match url.open().await {
            Ok(_) => panic!("{url} opened"),
            Err(error) => error,
        };
        eprintln!("{url}: {error}");
        let text = format!("{error} | {error:?}");
        assert!(!text.contains(SECRET), "{url}: {text}");
        let mut source = std::error::Error::source(&error);
        while let Some(cause) = source {
            let text = format!("{cause} | {cause:?}");
            assert!(!text.contains(SECRET), "{url}: {text}");
            source = cause.source();
        }
    }
}

/// `idem` reads the URL from `--store-file` and from `IDEM_STORE`, and
/// what it prints when the store cannot be opened has no password.
#[test]
fn the_command_reads_the_url_from_a_file_or_the_environment_and_hides_it() {
    let dir = std::env::temp_dir().join(format!("idem-cli-passwords-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("store-url");
    for raw in failing_urls() {
        std::fs::write(&file, format!("{raw}\n")).unwrap();
        let from_file = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
            .arg("--store-file")
            .arg(&file)
            .arg("stats")
            .env_remove("IDEM_STORE")
            .output()
            .unwrap();
        let from_env = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
            .arg("stats")
            .env("IDEM_STORE", &raw)
            .output()
            .unwrap();
        for output in [from_file, from_env] {
            let text = String::from_utf8_lossy(&output.stderr);
            assert_eq!(output.status.code(), Some(1), "{raw}: {text}");
            assert!(text.contains("cannot open"), "{raw}: {text}");
            assert!(!text.contains(SECRET), "{raw}: {text}");
        }
    }
    let missing = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["--store-file", "/nonexistent/store-url", "stats"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(2));
    std::fs::remove_dir_all(dir).unwrap();
}
