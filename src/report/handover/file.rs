//! The handover file's I/O: exec's atomic write, and the sidecar's guarded read and
//! its wake-up when a new version lands.

use std::io::Read as _;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::SystemTime;

use super::{FILE, MAX_BYTES, Observation, Rejected, parse};
use crate::tfconfig::{self, OutputError};

/// Writes one observation: a temporary file in `dir`, then a rename over [`FILE`], so
/// the sidecar reads the old version or the new one, never a part.
pub fn write(dir: &Path, o: &Observation) -> Result<(), OutputError> {
    let json = serde_json::to_vec(o).expect("an observation serializes");
    tfconfig::write_atomic(dir, FILE, &json)
}

/// One version read from the directory.
#[derive(Debug, Clone, PartialEq)]
pub struct Version {
    pub observation: Observation,
    /// When it was written (the file's mtime): how fresh it is.
    pub written: SystemTime,
}

/// Reads and validates `dir/`[`FILE`]. `Ok(None)`: there is none (yet). The read is
/// guarded against what a hostile training container could put there: a symlink is
/// not followed (it could point at the sidecar's token), a FIFO does not block, and at
/// most [`MAX_BYTES`]+1 bytes are read.
pub fn read(dir: &Path) -> Result<Option<Version>, Rejected> {
    let path = dir.join(FILE);
    let name = path.display().to_string();
    let unreadable = |e: std::io::Error| Rejected::Unreadable {
        path: name.clone(),
        why: e.to_string(),
    };
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        // ELOOP: the name is a symlink.
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(Rejected::NotAFile { path: name });
        }
        Err(e) => return Err(unreadable(e)),
    };
    let meta = f.metadata().map_err(unreadable)?;
    if !meta.is_file() {
        return Err(Rejected::NotAFile { path: name });
    }
    if meta.len() > MAX_BYTES as u64 {
        return Err(Rejected::TooLarge { path: name });
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    f.take(MAX_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(unreadable)?;
    let observation = parse(&bytes, &name)?;
    Ok(Some(Version {
        observation,
        written: meta.modified().unwrap_or_else(|_| SystemTime::now()),
    }))
}

/// Wakes the sidecar when exec renames a new version into the directory (inotify
/// `IN_MOVED_TO`, and `IN_CLOSE_WRITE` for a writer that does not rename). Without it
/// the sidecar still reads the file every `--interval`.
pub struct Watch {
    fd: tokio::io::unix::AsyncFd<inotify::Inotify>,
    name: &'static str,
}

impl Watch {
    /// Watches for `name` in `dir`; `None` (logged) where inotify cannot, and the
    /// reader falls back to reading it every `--interval`.
    pub fn or_poll(dir: &Path, name: &'static str) -> Option<Watch> {
        Watch::new(dir, name)
            .inspect_err(|e| {
                tracing::warn!(
                    "{e}; reading {} every --interval instead",
                    dir.join(name).display()
                )
            })
            .ok()
    }

    /// Watches for `name` in `dir`. Must run inside the tokio runtime.
    pub fn new(dir: &Path, name: &'static str) -> Result<Watch, String> {
        let ino = inotify::Inotify::init().map_err(|e| format!("inotify: {e}"))?;
        ino.watches()
            .add(
                dir,
                inotify::WatchMask::MOVED_TO | inotify::WatchMask::CLOSE_WRITE,
            )
            .map_err(|e| format!("inotify on {}: {e}", dir.display()))?;
        Ok(Watch {
            fd: crate::report::oom::notify::register(ino)?,
            name,
        })
    }

    /// Waits until the file lands in the directory.
    pub async fn wait(&mut self) -> std::io::Result<()> {
        loop {
            let mut guard = self.fd.readable_mut().await?;
            let mut buf = [0u8; 4096];
            let hit = guard.try_io(|inner| {
                let events = inner.get_mut().read_events(&mut buf)?;
                let name = self.name;
                Ok(events.filter(|e| e.name.is_some_and(|n| n == name)).count() > 0)
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

/// The next new version of a watched file, or never without a watch. A watch that
/// fails is dropped (logged), and the reader goes on reading every `--interval`.
pub async fn woken(watch: &mut Option<Watch>) -> Option<()> {
    let Some(w) = watch.as_mut() else {
        return std::future::pending().await;
    };
    if let Err(e) = w.wait().await {
        tracing::warn!(
            "watching {}: {e}; reading it every --interval instead",
            w.name
        );
        *watch = None;
    }
    Some(())
}
