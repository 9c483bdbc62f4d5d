//! Waking on a file's change: inotify, registered with tokio's reactor. The handover
//! files wake their reader when the other side renames a new version in
//! (`IN_MOVED_TO`, and `IN_CLOSE_WRITE` for a writer that does not rename), and cgroup
//! v2's `memory.events` wakes the OOM watch (`IN_MODIFY`). Registering a descriptor is
//! one of the crate's two `unsafe` sites (the other is `heap`'s `malloc_trim`); the
//! eventfd of cgroup v1's OOM notifier goes through [`register`] too.

use std::path::Path;

use tracing::warn;

/// Registers a file descriptor with tokio's reactor.
#[allow(unsafe_code)]
pub(crate) fn register<T: std::os::fd::AsRawFd>(
    inner: T,
) -> Result<tokio::io::unix::AsyncFd<T>, String> {
    // SAFETY: `inner` (an EventFd or an Inotify) owns its descriptor and closes it only
    // when dropped, which happens after the AsyncFd that holds it deregisters it.
    unsafe { tokio::io::unix::AsyncFd::register(inner) }.map_err(|e| e.to_string())
}

/// An inotify watch, with an optional name to wait for (a directory's entry).
pub struct FileWatch {
    fd: tokio::io::unix::AsyncFd<inotify::Inotify>,
    /// In a watched directory, the entry whose events count; `None`: every event.
    name: Option<&'static str>,
    /// What is watched, for messages.
    pub what: String,
}

impl FileWatch {
    /// Wakes when `name` lands in `dir` (renamed in, or closed after writing). Must run
    /// inside the tokio runtime.
    pub fn entry(dir: &Path, name: &'static str) -> Result<FileWatch, String> {
        let mask = inotify::WatchMask::MOVED_TO | inotify::WatchMask::CLOSE_WRITE;
        FileWatch::new(dir, mask, Some(name), dir.join(name).display().to_string())
    }

    /// Wakes when `file` changes. Must run inside the tokio runtime.
    pub fn file(file: &Path) -> Result<FileWatch, String> {
        FileWatch::new(
            file,
            inotify::WatchMask::MODIFY,
            None,
            file.display().to_string(),
        )
    }

    fn new(
        path: &Path,
        mask: inotify::WatchMask,
        name: Option<&'static str>,
        what: String,
    ) -> Result<FileWatch, String> {
        let ino = inotify::Inotify::init().map_err(|e| format!("inotify: {e}"))?;
        ino.watches()
            .add(path, mask)
            .map_err(|e| format!("inotify on {}: {e}", path.display()))?;
        Ok(FileWatch {
            fd: register(ino)?,
            name,
            what,
        })
    }

    /// Waits for the next event that counts.
    pub async fn wait(&mut self) -> std::io::Result<()> {
        loop {
            let mut guard = self.fd.readable_mut().await?;
            let mut buf = [0u8; 4096];
            let name = self.name;
            let hit = guard.try_io(|inner| {
                let events = inner.get_mut().read_events(&mut buf)?;
                Ok(match name {
                    Some(n) => events.filter(|e| e.name.is_some_and(|e| e == n)).count() > 0,
                    None => events.count() > 0,
                })
            });
            match hit {
                Ok(Ok(true)) => return Ok(()),
                Ok(Ok(false)) => continue,
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }
}

/// A watch on `name` in `dir`, or `None` (logged) where inotify cannot, and the reader
/// falls back to reading it every `--interval`.
pub fn entry_or_poll(dir: &Path, name: &'static str) -> Option<FileWatch> {
    FileWatch::entry(dir, name)
        .inspect_err(|e| {
            warn!(
                "{e}; reading {} every {} instead",
                dir.join(name).display(),
                crate::flags::long(crate::flags::INTERVAL)
            )
        })
        .ok()
}

/// The next change of a watched file, or never without a watch. A watch that fails is
/// dropped (logged), and the reader goes on reading every `--interval`.
pub async fn woken(watch: &mut Option<FileWatch>) -> Option<()> {
    let Some(w) = watch.as_mut() else {
        return std::future::pending().await;
    };
    if let Err(e) = w.wait().await {
        warn!(
            "watching {}: {e}; reading it every {} instead",
            w.what,
            crate::flags::long(crate::flags::INTERVAL)
        );
        *watch = None;
    }
    Some(())
}
