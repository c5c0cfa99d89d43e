//! Headless Chromium driven over W3C WebDriver by `chromedriver`, both from
//! Debian's packages (`dev/chromium/install`).
//!
//! The protocol is a dozen JSON calls over HTTP; the tests make them with
//! reqwest and serde_json, which the crate's tests already build, rather
//! than bring a WebDriver crate and its HTTP stack into the build. A form
//! is filled and submitted by clicks, as a person does, so the browser
//! sends the cookie, the CSRF field and the POST itself.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";

/// The key WebDriver names an element by.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A browser session, ended with its driver when dropped.
pub(crate) struct Browser {
    driver: Child,
    base: String,
    http: reqwest::Client,
}

/// One element of the page.
pub(crate) struct Element<'a> {
    browser: &'a Browser,
    id: String,
}

impl Browser {
    /// Starts `chromedriver` and a headless Chromium, or `None` after
    /// printing why not (a failure instead under CI).
    pub(crate) async fn start() -> Option<Browser> {
        if !std::path::Path::new(CHROMEDRIVER).exists() || !std::path::Path::new(CHROMIUM).exists()
        {
            return idem_testing::skip(&format!(
                "no {CHROMEDRIVER} or {CHROMIUM}: run dev/chromium/install"
            ));
        }
        let port = idem_testing::process::free_port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver runs");
        let mut browser = Browser {
            driver,
            base: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
        };
        let ready = Instant::now() + Duration::from_secs(20);
        while browser
            .http
            .get(browser.url("/status"))
            .send()
            .await
            .is_err()
        {
            assert!(Instant::now() < ready, "chromedriver did not answer");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let session = browser
            .call(
                reqwest::Method::POST,
                "/session",
                json!({"capabilities": {"alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": {
                        "binary": CHROMIUM,
                        "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                                 "--disable-dev-shm-usage", "--window-size=1100,760"]
                    }
                }}}),
            )
            .await;
        let id = session["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {session}"));
        browser.base = format!("{}/session/{id}", browser.base);
        Some(browser)
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// One WebDriver call; its `value`. A WebDriver error fails the test.
    async fn call(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let mut request = self.http.request(method, self.url(path));
        if !body.is_null() {
            request = request.json(&body);
        }
        let response = request.send().await.expect("chromedriver answers");
        let status = response.status();
        let answer: Value = response.json().await.expect("chromedriver answers JSON");
        assert!(status.is_success(), "WebDriver {path}: {status} {answer}");
        answer["value"].clone()
    }

    /// Opens `url` and waits for its page to load.
    pub(crate) async fn open(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", json!({ "url": url }))
            .await;
    }

    /// The page's visible text.
    pub(crate) async fn text(&self) -> String {
        self.find("body").await.text().await
    }

    /// The page's title.
    pub(crate) async fn title(&self) -> String {
        let title = self.call(reqwest::Method::GET, "/title", Value::Null).await;
        title.as_str().unwrap_or_default().to_owned()
    }

    /// The first element `css` selects; the test fails when there is none.
    pub(crate) async fn find(&self, css: &str) -> Element<'_> {
        self.find_by("css selector", css).await
    }

    /// The first link whose text contains `text`.
    pub(crate) async fn link(&self, text: &str) -> Element<'_> {
        self.find_by("partial link text", text).await
    }

    async fn find_by(&self, using: &str, value: &str) -> Element<'_> {
        let found = self
            .call(
                reqwest::Method::POST,
                "/element",
                json!({ "using": using, "value": value }),
            )
            .await;
        let id = found[ELEMENT]
            .as_str()
            .unwrap_or_else(|| panic!("no element {value}: {found}"));
        Element {
            browser: self,
            id: id.to_owned(),
        }
    }

    /// A PNG of the window, written to `path`.
    pub(crate) async fn screenshot(&self, path: &std::path::Path) {
        use base64::Engine;
        let shot = self
            .call(reqwest::Method::GET, "/screenshot", Value::Null)
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot.as_str().expect("a base64 PNG"))
            .expect("a base64 PNG");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(path, png).unwrap();
    }
}

impl Element<'_> {
    /// Clicks it (a link or a form's button), and waits until the page
    /// it was on is gone: WebDriver's click may return before a form's
    /// submission navigates, and later calls wait for the new page's load.
    pub(crate) async fn click(&self) {
        let old = self.browser.find("body").await;
        let path = format!("/element/{}/click", self.id);
        self.browser
            .call(reqwest::Method::POST, &path, json!({}))
            .await;
        let gone = Instant::now() + Duration::from_secs(20);
        loop {
            let path = format!("/element/{}/text", old.id);
            let answer = self.browser.http.get(self.browser.url(&path)).send().await;
            if answer.is_ok_and(|r| r.status() == reqwest::StatusCode::NOT_FOUND) {
                return;
            }
            assert!(Instant::now() < gone, "the click opened no page");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Types `text` into it.
    pub(crate) async fn type_text(&self, text: &str) {
        let path = format!("/element/{}/value", self.id);
        self.browser
            .call(reqwest::Method::POST, &path, json!({ "text": text }))
            .await;
    }

    /// Its rendered height in CSS pixels: 0 for an element the page
    /// holds but does not draw.
    pub(crate) async fn height(&self) -> f64 {
        let path = format!("/element/{}/rect", self.id);
        let rect = self
            .browser
            .call(reqwest::Method::GET, &path, Value::Null)
            .await;
        rect["height"].as_f64().unwrap_or_default()
    }

    /// Its visible text.
    pub(crate) async fn text(&self) -> String {
        let path = format!("/element/{}/text", self.id);
        let text = self
            .browser
            .call(reqwest::Method::GET, &path, Value::Null)
            .await;
        text.as_str().unwrap_or_default().to_owned()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Ending the session closes Chromium; then the driver stops. A
        // plain blocking request, as a drop cannot wait on the runtime.
        use std::io::{Read, Write};
        let rest = self.base.trim_start_matches("http://");
        if let Some((host, path)) = rest.split_once('/') {
            if let Ok(mut stream) = std::net::TcpStream::connect(host) {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                let _ = write!(
                    stream,
                    "DELETE /{path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
                let _ = stream.read_to_end(&mut Vec::new());
            }
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
