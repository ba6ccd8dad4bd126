//! This process's memory: as the kernel counts it, for the benchmarks that
//! print it beside llama.cpp's own (Linux; `None` elsewhere), and handing
//! freed pages back after a busy spell.

/// Resident memory now, in MiB.
pub fn resident_mb() -> Option<f64> {
    status_mb("VmRSS:")
}

/// Resident memory not backed by a file (heap, stacks, anonymous maps), in
/// MiB: what a load allocates, apart from the weights it maps.
pub fn anonymous_resident_mb() -> Option<f64> {
    status_mb("RssAnon:")
}

/// The most resident memory so far, in MiB.
pub fn peak_resident_mb() -> Option<f64> {
    status_mb("VmHWM:")
}

fn status_mb(key: &str) -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// Returns free heap pages to the system. glibc keeps what a burst of
/// requests freed (per-thread arenas, holes in the heap), so after a busy
/// spell the process would otherwise stay at its peak size while idle.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(crate) fn release_free_memory() {
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Elsewhere (macOS, musl) the allocator is left to itself.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn release_free_memory() {}
