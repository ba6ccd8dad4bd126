//! A GGUF copy holding only some tensors, so a pipeline stage reads from disk
//! and holds in memory just its layers.
//!
//! MLX's GGUF loader materializes every tensor of the file it opens. A stage
//! therefore loads a copy written here: the whole header (metadata, vocabulary,
//! chat template) byte for byte, and only the tensors the stage keeps, read by
//! seeking to each one. MLX stays the one reader of quantized GGUF blocks.
use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::Path;

use super::stage::{gguf_part, Span};
use crate::error::{EngineError, Result};

const MAGIC: &[u8; 4] = b"GGUF";
/// Where the metadata starts: after magic, version and the two counts.
const KV_START: u64 = 24;

/// What a subset copy holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subset {
    pub tensors_kept: usize,
    pub tensors_total: usize,
    /// Tensor bytes copied (the stage's share of the weights on disk).
    pub bytes_kept: u64,
}

fn bad(why: impl std::fmt::Display) -> EngineError {
    EngineError::InvalidModel(format!("GGUF: {why}"))
}

fn align(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

/// Writes to `dst` a GGUF with all of `src`'s metadata and only the tensors
/// a stage running `layers` keeps. The number of blocks and whether the
/// output is tied (no `output.weight`) are read from the tensor names.
pub fn write_stage(src: &Path, dst: &Path, layers: &std::ops::Range<usize>) -> Result<Subset> {
    let header = shoal_gguf::Header::read(src).map_err(bad)?;
    let infos = &header.tensors;
    let (alignment, data_start) = (header.alignment, header.data_offset);
    let data_len = header
        .file_len
        .checked_sub(data_start)
        .ok_or_else(|| bad("the file ends inside its header"))?;
    // A tensor's bytes run to the next tensor's start (or the file's end):
    // this needs no table of block sizes per quantization type.
    let mut order: Vec<usize> = (0..infos.len()).collect();
    order.sort_by_key(|&i| infos[i].offset);
    let mut sizes = vec![0u64; infos.len()];
    for (n, &i) in order.iter().enumerate() {
        let end = order.get(n + 1).map_or(data_len, |&j| infos[j].offset);
        sizes[i] = end
            .checked_sub(infos[i].offset)
            .filter(|_| end <= data_len)
            .ok_or_else(|| bad(format!("tensor {} lies outside the file", infos[i].name)))?;
    }
    let num_layers = infos
        .iter()
        .filter_map(|t| match gguf_part(&t.name) {
            super::stage::Part::Block(i) => Some(i + 1),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let span = Span {
        layers: layers.clone(),
        num_layers,
        tied_output: !infos.iter().any(|t| t.name == "output.weight"),
    };
    let kept: Vec<(&shoal_gguf::TensorInfo, u64)> = infos
        .iter()
        .zip(sizes)
        .filter(|(t, _)| span.keeps(gguf_part(&t.name)))
        .collect();
    let mut file = File::open(src).map_err(|e| bad(format!("{}: {e}", src.display())))?;
    let write_err = |e: std::io::Error| bad(format!("writing {}: {e}", dst.display()));
    let mut out = BufWriter::new(File::create(dst).map_err(write_err)?);
    out.write_all(MAGIC).map_err(write_err)?;
    out.write_all(&header.version.to_le_bytes())
        .map_err(write_err)?;
    out.write_all(&(kept.len() as u64).to_le_bytes())
        .map_err(write_err)?;
    out.write_all(&header.n_kv.to_le_bytes())
        .map_err(write_err)?;
    file.seek(SeekFrom::Start(KV_START))
        .map_err(|e| bad(format!("reading {}: {e}", src.display())))?;
    copy_exact(&mut file, &mut out, header.metadata_end - KV_START)?;
    let mut offset = 0u64;
    let mut placed = Vec::with_capacity(kept.len());
    for (t, size) in &kept {
        let name = t.name.as_bytes();
        out.write_all(&(name.len() as u64).to_le_bytes())
            .map_err(write_err)?;
        out.write_all(name).map_err(write_err)?;
        out.write_all(&(t.dims.len() as u32).to_le_bytes())
            .map_err(write_err)?;
        for d in &t.dims {
            out.write_all(&d.to_le_bytes()).map_err(write_err)?;
        }
        out.write_all(&t.ggml_type.to_le_bytes())
            .map_err(write_err)?;
        out.write_all(&offset.to_le_bytes()).map_err(write_err)?;
        placed.push(offset);
        offset = align(offset + size, alignment);
    }
    let mut pos = out.stream_position().map_err(write_err)?;
    let header_end = align(pos, alignment);
    pad_to(&mut out, &mut pos, header_end)?;
    let body = pos;
    let mut bytes_kept = 0;
    for ((t, size), at) in kept.iter().zip(placed) {
        pad_to(&mut out, &mut pos, body + at)?;
        file.seek(SeekFrom::Start(data_start + t.offset))
            .map_err(|e| bad(format!("reading {}: {e}", src.display())))?;
        copy_exact(&mut file, &mut out, *size)?;
        pos += size;
        bytes_kept += size;
    }
    out.flush().map_err(write_err)?;
    Ok(Subset {
        tensors_kept: kept.len(),
        tensors_total: infos.len(),
        bytes_kept,
    })
}

fn pad_to(out: &mut impl Write, pos: &mut u64, target: u64) -> Result<()> {
    let n = target.saturating_sub(*pos);
    std::io::copy(&mut std::io::repeat(0).take(n), out)
        .map_err(|e| bad(format!("writing the copy: {e}")))?;
    *pos += n;
    Ok(())
}

fn copy_exact(from: &mut File, to: &mut impl Write, n: u64) -> Result<()> {
    let copied =
        std::io::copy(&mut from.take(n), to).map_err(|e| bad(format!("copying tensors: {e}")))?;
    if copied != n {
        return Err(bad("the file ends inside a tensor"));
    }
    Ok(())
}
