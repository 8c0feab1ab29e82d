//! Who used the CPU: the `[idle]` pseudo-image.
//!
//! Samples of the idle task (pid 0, the swapper) are kernel samples like any other, but on a
//! mostly idle machine they are nearly all of them: counted as the kernel they would make the
//! kernel look like the hottest image. They are kept apart as `[idle]` (FORMAT.md §5.1.1).

use std::sync::Arc;

use profile_format::{ImageId, ImageKind};

use crate::types::ImageInfo;

/// Path of the idle pseudo-image, as reports show it.
pub const IDLE_PATH: &[u8] = b"[idle]";

/// The `[idle]` image of the kernel `kernel`: kind `Kernel` with the same offsets (so its
/// samples symbolize against the epoch's kallsyms snapshot, e.g. `default_idle`, and a reader
/// that predates `[idle]` shows it as one more kernel image), but its own identity.
pub fn idle_image(kernel: &ImageInfo) -> Arc<ImageInfo> {
    Arc::new(ImageInfo {
        kind: ImageKind::Kernel,
        id: ImageId::special("[idle]", kernel.id.to_text().as_bytes()),
        path: IDLE_PATH.to_vec(),
        jit_symbols: Vec::new(),
    })
}
