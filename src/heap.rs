//! Giving freed heap back to the kernel after a burst.
//!
//! glibc keeps the memory a burst of allocations freed, for reuse, and trims only the
//! top of the heap: after 500 slow clients were served and gone, the sidecar kept their
//! buffers (about 11 MiB) for good, inside a 128 MiB container. `malloc_trim(0)` hands
//! every whole free page back (glibc madvises them away), so the resident size returns
//! to its resting level. It is called rarely: when a burst of connections has ended.

/// Returns the heap's free pages to the kernel.
#[allow(unsafe_code)]
pub fn release_freed() {
    // SAFETY: malloc_trim takes no pointers and only changes which of the allocator's
    // free pages stay resident; every live allocation is untouched.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0);
    }
}
