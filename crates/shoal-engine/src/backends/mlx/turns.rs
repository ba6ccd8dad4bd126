//! MLX's turn-taking: MLX is driven from one thread at a time per process,
//! and held at exit so no engine thread touches it while it is torn down.
//! Engines see this only as [`crate::backend::LanguageModel::turn`].
use std::time::Instant;

/// MLX is not safe to drive from several threads at once (its streams,
/// graph evaluation and allocator are shared per process). Each engine runs
/// on its own thread, so with several models loaded their steps take turns
/// through this lock; one engine alone never waits on it.
static MLX: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// At process exit, MLX's static objects (allocator, streams) are destroyed
/// while other threads still run: an engine thread mid-step, or freeing a
/// dropped model, would then work on a torn-down allocator (heap corruption
/// at exit). This hook is registered after MLX has built those objects (once
/// a model is loaded), so it runs before their destructors; it waits for the
/// running step to end and keeps the MLX turn, so no engine thread touches
/// MLX again. It gives up after 30 s rather than hang an exit.
extern "C" fn hold_mlx_at_exit() {
    let deadline = Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match MLX.try_lock() {
            Ok(guard) => return std::mem::forget(guard),
            Err(std::sync::TryLockError::Poisoned(p)) => return std::mem::forget(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(1))
            }
            Err(std::sync::TryLockError::WouldBlock) => return,
        }
    }
}

pub(crate) fn hold_mlx_at_exit_once() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a plain function with no captured state.
        if unsafe { libc::atexit(hold_mlx_at_exit) } != 0 {
            tracing::warn!("could not register the MLX exit hook");
        }
    });
}

pub(crate) fn mlx_turn() -> std::sync::MutexGuard<'static, ()> {
    MLX.lock().unwrap_or_else(|p| p.into_inner())
}
