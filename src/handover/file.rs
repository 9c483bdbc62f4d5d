//! The handover files' I/O, one way for both: the writer's atomic replace, and the
//! reader's guarded read of a file that the other container could have made anything:
//! a symlink is not followed (it could point at the sidecar's token), a FIFO does not
//! block, and no more than the format's bound is read.

use std::io::Read as _;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::SystemTime;

use crate::render::{self, OutputError};

/// Writes `dir/name`: a temporary file in `dir`, then a rename over it, so the reader
/// sees the old version or the new one, never a part.
pub fn write(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), OutputError> {
    render::write_atomic(dir, name, bytes)
}

/// Why a file could not be read as the other side should have written it.
#[derive(Debug)]
pub enum ReadError {
    /// A symlink, a FIFO, a directory: not what the other side writes.
    NotAFile,
    /// Larger than the bound.
    TooLarge,
    Unreadable(std::io::Error),
}

/// Reads `path`, at most `max` bytes; `Ok(None)` when there is no such file (yet).
/// Returns the bytes and when they were written (the file's mtime).
pub fn read_bounded(path: &Path, max: usize) -> Result<Option<(Vec<u8>, SystemTime)>, ReadError> {
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        // ELOOP: the name is a symlink.
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(ReadError::NotAFile),
        Err(e) => return Err(ReadError::Unreadable(e)),
    };
    let meta = f.metadata().map_err(ReadError::Unreadable)?;
    if !meta.is_file() {
        return Err(ReadError::NotAFile);
    }
    if meta.len() > max as u64 {
        return Err(ReadError::TooLarge);
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    f.take(max as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(ReadError::Unreadable)?;
    if bytes.len() > max {
        return Err(ReadError::TooLarge);
    }
    let written = meta.modified().unwrap_or_else(|_| SystemTime::now());
    Ok(Some((bytes, written)))
}
