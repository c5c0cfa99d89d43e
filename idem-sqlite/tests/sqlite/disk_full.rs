//! SQLite on a file system that runs out of space in the middle of a storm
//! of calls: a small `tmpfs` this test mounts (it needs root), filled by a
//! file the test writes until the kernel refuses a byte more, then freed.
//! While it is full every failed call is a store error whose `When` says
//! truly whether the work ran; nothing runs twice under its lease; after
//! the space is freed the same store serves again, without reopening, the
//! file passes `PRAGMA integrity_check`, and every outcome a caller was
//! told (before, during or after the fault) replays.
//! `IDEM_DISK_FULL_TRIALS` (default 1) sets the storms.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use idem_core::Idempotent;
use idem_sqlite::{rusqlite, SqliteStore};
use idem_testing::storm::{self, Figures, Storm};

/// A `tmpfs` of `size` mounted on a fresh directory, unmounted when
/// dropped.
struct Mount {
    dir: tempfile::TempDir,
}

impl Mount {
    fn new(size: &str) -> Result<Mount, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let output = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("mount does not run: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "cannot mount a tmpfs (the test needs root): {}",
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        Ok(Mount { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Writes `path` until the file system refuses more; returns the bytes.
fn fill(path: &Path) -> u64 {
    let mut file = std::fs::File::create(path).expect("the filler file");
    let chunk = vec![0xA5; 4096];
    let mut written = 0;
    loop {
        match file.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(28) => break, // ENOSPC
            Err(e) => panic!("filling the disk: {e}"),
        }
    }
    // Whatever the page cache still holds must hit the same wall.
    let _ = file.sync_all();
    written
}

fn integrity(path: &PathBuf) -> String {
    let connection = rusqlite::Connection::open(path).expect("the file opens");
    connection
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .expect("integrity_check runs")
}

async fn storm() -> Option<Figures> {
    let mount = match Mount::new("32m") {
        Ok(mount) => mount,
        Err(reason) => return idem_testing::skip(&reason),
    };
    let file = mount.path().join("idem.db");
    let store = SqliteStore::open(&file).await.expect("the store opens");
    store.migrate().await.expect("migrate");
    // Every second run in this storm is one under a live lease.
    let idem = Idempotent::new(store).with_lease(Duration::from_secs(120));
    let storm = Storm::start(&idem, 8);
    let filler = mount.path().join("filler");
    tokio::task::block_in_place(|| {
        storm.wait(
            Storm::told,
            300,
            "no calls completed before the disk filled",
        );
        let filled = fill(&filler);
        assert!(filled > 0, "the disk was full before the filler");
        let refused = storm.refused();
        storm.wait(
            Storm::refused,
            refused + 50,
            "no call failed on the full disk",
        );
        std::fs::remove_file(&filler).expect("the filler goes");
        storm.fault_ended();
        storm.wait(
            Storm::told_after_fault,
            300,
            "the store did not serve again after space was freed",
        );
    });
    let figures = storm.finish().await;
    assert_eq!(integrity(&file), "ok", "the file is damaged: {figures:?}");
    Some(figures)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_calls_truly_and_loses_nothing_once_freed() {
    storm::trials("IDEM_DISK_FULL_TRIALS", "disk full", storm, |f| {
        f.assert_safe(600);
        let failed = f.errors_before_work + f.errors_after_work;
        assert!(failed >= 50, "too few calls failed: {f:?}");
    })
    .await;
}
