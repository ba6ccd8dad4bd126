//! A GGUF copy holding only some tensors, so a pipeline stage reads from disk
//! and holds in memory just its layers.
//!
//! MLX's GGUF loader materializes every tensor of the file it opens. A stage
//! therefore loads a copy written here: the whole header (metadata, vocabulary,
//! chat template) byte for byte, and only the tensors the stage keeps, read by
//! seeking to each one. MLX stays the one reader of quantized GGUF blocks.
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::Path;

use super::stage::{gguf_part, Span};
use crate::error::{EngineError, Result};

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// Metadata value type of strings and arrays in the GGUF spec.
const TYPE_STRING: u32 = 8;
const TYPE_ARRAY: u32 = 9;
const TYPE_UINT32: u32 = 4;

/// What a subset copy holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subset {
    pub tensors_kept: usize,
    pub tensors_total: usize,
    /// Tensor bytes copied (the stage's share of the weights on disk).
    pub bytes_kept: u64,
}

struct TensorInfo {
    name: String,
    dims: Vec<u64>,
    ggml_type: u32,
    offset: u64,
    size: u64,
}

fn bad(why: impl std::fmt::Display) -> EngineError {
    EngineError::InvalidModel(format!("GGUF: {why}"))
}

struct Reader<R> {
    inner: R,
}

impl<R: Read> Reader<R> {
    fn bytes<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut b = [0u8; N];
        self.inner
            .read_exact(&mut b)
            .map_err(|e| bad(format!("header cut short ({e})")))?;
        Ok(b)
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }
    fn string(&mut self) -> Result<String> {
        let len = self.u64()?;
        if len > 1 << 30 {
            return Err(bad(format!("string of {len} bytes")));
        }
        let mut b = vec![0u8; len as usize];
        self.inner
            .read_exact(&mut b)
            .map_err(|e| bad(format!("header cut short ({e})")))?;
        String::from_utf8(b).map_err(|_| bad("a name is not UTF-8"))
    }
    /// Skips one metadata value of type `ty`; returns it when it is a u32
    /// (the only scalar the copy needs: `general.alignment`).
    fn skip_value(&mut self, ty: u32, depth: u32) -> Result<Option<u32>> {
        let width = match ty {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            TYPE_UINT32 => return self.u32().map(Some),
            5 | 6 => 4,
            10..=12 => 8,
            TYPE_STRING => {
                let len = self.u64()?;
                self.discard(len)?;
                return Ok(None);
            }
            TYPE_ARRAY if depth < 4 => {
                let item = self.u32()?;
                let n = self.u64()?;
                for _ in 0..n {
                    self.skip_value(item, depth + 1)?;
                }
                return Ok(None);
            }
            other => return Err(bad(format!("metadata value type {other}"))),
        };
        self.discard(width)?;
        Ok(None)
    }
    fn discard(&mut self, n: u64) -> Result<()> {
        let copied = std::io::copy(&mut (&mut self.inner).take(n), &mut std::io::sink())
            .map_err(|e| bad(format!("header cut short ({e})")))?;
        if copied != n {
            return Err(bad("header cut short"));
        }
        Ok(())
    }
}

fn align(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

/// Writes to `dst` a GGUF with all of `src`'s metadata and only the tensors
/// a stage running `layers` keeps. The number of blocks and whether the
/// output is tied (no `output.weight`) are read from the tensor names.
pub fn write_stage(src: &Path, dst: &Path, layers: &std::ops::Range<usize>) -> Result<Subset> {
    let open = |p: &Path| bad(format!("{}: cannot open", p.display()));
    let mut file = File::open(src).map_err(|_| open(src))?;
    let file_len = file
        .metadata()
        .map_err(|e| bad(format!("{}: {e}", src.display())))?
        .len();
    let mut r = Reader {
        inner: BufReader::new(&mut file),
    };
    if &r.bytes::<4>()? != MAGIC {
        return Err(bad(format!("{} is not a GGUF file", src.display())));
    }
    let version = r.u32()?;
    if !(2..=3).contains(&version) {
        return Err(bad(format!("version {version} (supported: 2, 3)")));
    }
    let n_tensors = r.u64()?;
    let n_kv = r.u64()?;
    if n_tensors > 1 << 24 || n_kv > 1 << 24 {
        return Err(bad("implausible tensor or key count"));
    }
    let kv_start = 24u64;
    let mut alignment = DEFAULT_ALIGNMENT;
    for _ in 0..n_kv {
        let key = r.string()?;
        let ty = r.u32()?;
        if let Some(v) = r.skip_value(ty, 0)? {
            if key == "general.alignment" {
                alignment = u64::from(v);
            }
        }
    }
    if alignment == 0 || !alignment.is_power_of_two() {
        return Err(bad(format!("alignment {alignment}")));
    }
    let kv_end = r
        .inner
        .stream_position()
        .map_err(|e| bad(format!("reading the header: {e}")))?;
    let mut infos = Vec::with_capacity(n_tensors as usize);
    for _ in 0..n_tensors {
        let name = r.string()?;
        let n_dims = r.u32()?;
        if n_dims > 8 {
            return Err(bad(format!("tensor {name} has {n_dims} dimensions")));
        }
        let dims = (0..n_dims).map(|_| r.u64()).collect::<Result<Vec<_>>>()?;
        let ggml_type = r.u32()?;
        let offset = r.u64()?;
        infos.push(TensorInfo {
            name,
            dims,
            ggml_type,
            offset,
            size: 0,
        });
    }
    let data_start = align(
        r.inner
            .stream_position()
            .map_err(|e| bad(format!("reading the header: {e}")))?,
        alignment,
    );
    let data_len = file_len
        .checked_sub(data_start)
        .ok_or_else(|| bad("the file ends inside its header"))?;
    // A tensor's bytes run to the next tensor's start (or the file's end):
    // this needs no table of block sizes per quantization type.
    let mut order: Vec<usize> = (0..infos.len()).collect();
    order.sort_by_key(|&i| infos[i].offset);
    for (n, &i) in order.iter().enumerate() {
        let end = order.get(n + 1).map_or(data_len, |&j| infos[j].offset);
        infos[i].size = end
            .checked_sub(infos[i].offset)
            .filter(|_| end <= data_len)
            .ok_or_else(|| bad(format!("tensor {} lies outside the file", infos[i].name)))?;
    }
    drop(r);

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
    let kept: Vec<&TensorInfo> = infos
        .iter()
        .filter(|t| span.keeps(gguf_part(&t.name)))
        .collect();
    let write_err = |e: std::io::Error| bad(format!("writing {}: {e}", dst.display()));
    let mut out = BufWriter::new(File::create(dst).map_err(write_err)?);
    out.write_all(MAGIC).map_err(write_err)?;
    out.write_all(&version.to_le_bytes()).map_err(write_err)?;
    out.write_all(&(kept.len() as u64).to_le_bytes())
        .map_err(write_err)?;
    out.write_all(&n_kv.to_le_bytes()).map_err(write_err)?;
    file.seek(SeekFrom::Start(kv_start))
        .map_err(|e| bad(format!("reading {}: {e}", src.display())))?;
    copy_exact(&mut file, &mut out, kv_end - kv_start)?;
    let mut offset = 0u64;
    let mut placed = Vec::with_capacity(kept.len());
    for t in &kept {
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
        offset = align(offset + t.size, alignment);
    }
    let mut pos = out.stream_position().map_err(write_err)?;
    let header_end = align(pos, alignment);
    pad_to(&mut out, &mut pos, header_end)?;
    let body = pos;
    let mut bytes_kept = 0;
    for (t, at) in kept.iter().zip(placed) {
        pad_to(&mut out, &mut pos, body + at)?;
        file.seek(SeekFrom::Start(data_start + t.offset))
            .map_err(|e| bad(format!("reading {}: {e}", src.display())))?;
        copy_exact(&mut file, &mut out, t.size)?;
        pos += t.size;
        bytes_kept += t.size;
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
