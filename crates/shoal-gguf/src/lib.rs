//! Reads a GGUF file's header — metadata and tensor table, never the
//! weights — so a model can be described, checked and routed to a backend
//! before any native library sees the file (llama.cpp aborts the process on
//! some malformed files instead of returning an error).
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

/// Why a header could not be read.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{path}: {why}")]
    Malformed { path: PathBuf, why: String },
    /// The bytes end inside the header (a file cut short, or a prefix of a
    /// file too short to hold its header).
    #[error("{path}: the header is cut short at byte {at}")]
    CutShort { path: PathBuf, at: u64 },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

pub type Result<T> = std::result::Result<T, GgufError>;

/// A metadata value. Arrays of text or floats keep their length and element
/// type only: the big ones (vocabularies, merges, scores) are not needed to
/// describe a model. Integer arrays (token types) are kept whole.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Uint(u64),
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    Array { elem_type: u32, len: u64 },
    Ints(Vec<i64>),
}

/// One entry of the tensor table.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions, innermost first (GGUF order).
    pub dims: Vec<u64>,
    /// The `ggml_type` number.
    pub ggml_type: u32,
    /// Offset from the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    pub fn elements(&self) -> u64 {
        self.dims.iter().fold(1u64, |a, &d| a.saturating_mul(d))
    }
}

/// A GGUF header.
#[derive(Debug, Clone)]
pub struct Header {
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    /// Metadata entries as counted in the file (keys may repeat).
    pub n_kv: u64,
    /// Where the metadata ends and the tensor table begins.
    pub metadata_end: u64,
    /// `general.alignment` (32 when absent).
    pub alignment: u64,
    /// Where the tensor data starts in the file (aligned).
    pub data_offset: u64,
    /// The file's length in bytes.
    pub file_len: u64,
    /// Tokens of the vocabulary (`tokenizer.ggml.tokens`) written as
    /// markers, `<…>` of at most [`MARKER_BYTES`] bytes (control tokens such
    /// as `</think>` or `<tool_call>`), so what a model can do is known
    /// without loading it. At most [`MARKERS`] are kept.
    pub markers: std::collections::BTreeSet<String>,
}

/// The longest token kept in [`Header::markers`].
pub const MARKER_BYTES: usize = 64;
/// The most tokens kept in [`Header::markers`] (a hostile file cannot make
/// the reader hold more).
pub const MARKERS: usize = 4096;

impl Header {
    /// Reads the header of the GGUF file at `path`.
    pub fn read(path: &Path) -> Result<Header> {
        let file = File::open(path).map_err(|source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let file_len = file
            .metadata()
            .map_err(|source| GgufError::Io {
                path: path.to_path_buf(),
                source,
            })?
            .len();
        Header::parse(BufReader::new(file), file_len, path)
    }

    /// Reads a header from the first bytes of a GGUF file of `file_len`
    /// bytes (say, a ranged download of a file not yet fetched); `name`
    /// names it in errors. [`GgufError::CutShort`] means more bytes are needed.
    pub fn from_prefix(bytes: &[u8], file_len: u64, name: &Path) -> Result<Header> {
        Header::parse(bytes, file_len, name)
    }

    fn parse(r: impl Read, file_len: u64, path: &Path) -> Result<Header> {
        let mut r = Reader { r, path, pos: 0 };
        if &r.bytes::<4>()? != b"GGUF" {
            return Err(r.bad("not a GGUF file"));
        }
        let version = r.u32()?;
        if !(2..=3).contains(&version) {
            return Err(r.bad(format!("GGUF version {version} (2 and 3 are known)")));
        }
        let n_tensors = r.u64()?;
        let n_kv = r.u64()?;
        // Each entry takes at least a few bytes: counts beyond the file are lies.
        if n_tensors > file_len / 8 || n_kv > file_len / 8 {
            return Err(r.bad(format!(
                "header claims {n_tensors} tensors and {n_kv} metadata keys in a {file_len}-byte file"
            )));
        }
        let mut metadata = BTreeMap::new();
        let mut markers = std::collections::BTreeSet::new();
        for _ in 0..n_kv {
            let key = r.string()?;
            let ty = r.u32()?;
            let value = if key == "tokenizer.ggml.tokens" && ty == 9 {
                r.tokens(&mut markers)?
            } else {
                r.value(ty, 0)?
            };
            metadata.insert(key, value);
        }
        let metadata_end = r.pos;
        let mut tensors = Vec::with_capacity(n_tensors.min(1 << 16) as usize);
        for _ in 0..n_tensors {
            let name = r.string()?;
            let n_dims = r.u32()?;
            if n_dims == 0 || n_dims > 4 {
                return Err(r.bad(format!("tensor {name} has {n_dims} dimensions")));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(r.u64()?);
            }
            let ggml_type = r.u32()?;
            let offset = r.u64()?;
            tensors.push(TensorInfo {
                name,
                dims,
                ggml_type,
                offset,
            });
        }
        let alignment = match metadata.get("general.alignment") {
            Some(Value::Uint(a)) if *a > 0 && a.is_power_of_two() => *a,
            Some(_) => return Err(r.bad("general.alignment is not a power of two")),
            None => 32,
        };
        let data_offset = r.pos.div_ceil(alignment) * alignment;
        Ok(Header {
            version,
            metadata,
            tensors,
            n_kv,
            metadata_end,
            alignment,
            data_offset,
            file_len,
            markers,
        })
    }

    pub fn string(&self, key: &str) -> Option<&str> {
        match self.metadata.get(key) {
            Some(Value::Str(s)) => Some(s),
            _ => None,
        }
    }

    /// An integer array, e.g. `tokenizer.ggml.token_type`.
    pub fn ints(&self, key: &str) -> Option<&[i64]> {
        match self.metadata.get(key) {
            Some(Value::Ints(v)) => Some(v),
            _ => None,
        }
    }

    pub fn uint(&self, key: &str) -> Option<u64> {
        match self.metadata.get(key) {
            Some(Value::Uint(n)) => Some(*n),
            Some(Value::Int(n)) => u64::try_from(*n).ok(),
            _ => None,
        }
    }

    pub fn float(&self, key: &str) -> Option<f64> {
        match self.metadata.get(key) {
            Some(Value::Float(x)) => Some(*x),
            Some(Value::Uint(n)) => Some(*n as f64),
            Some(Value::Int(n)) => Some(*n as f64),
            _ => None,
        }
    }

    /// How many elements the array under `key` holds (0 when the key is
    /// absent or not an array), e.g. `tokenizer.ggml.tokens`.
    pub fn array_len(&self, key: &str) -> u64 {
        match self.metadata.get(key) {
            Some(Value::Array { len, .. }) => *len,
            Some(Value::Ints(v)) => v.len() as u64,
            _ => 0,
        }
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Option<&str> {
        self.string("general.architecture")
    }

    /// A key of the model's own architecture, e.g. `context_length` →
    /// `qwen2.context_length`.
    pub fn arch_uint(&self, key: &str) -> Option<u64> {
        self.uint(&format!("{}.{key}", self.architecture()?))
    }

    /// A boolean key of the model's own architecture, e.g. `attention.causal`.
    pub fn arch_bool(&self, key: &str) -> Option<bool> {
        match self
            .metadata
            .get(&format!("{}.{key}", self.architecture()?))
        {
            Some(Value::Bool(b)) => Some(*b),
            _ => None,
        }
    }

    /// How an embedding model pools its states (`mean`, `cls`, `last`); `None`
    /// for a model that generates text. A file is an embedding model when
    /// `{arch}.pooling_type` names one of those, or when its attention is
    /// not causal (an encoder) and it names no pooling: then mean, the
    /// sentence-transformers default. A reranker (`rank`) is not one.
    pub fn embedding_pooling(&self) -> Option<&'static str> {
        match self.arch_uint("pooling_type") {
            Some(1) => Some("mean"),
            Some(2) => Some("cls"),
            Some(3) => Some("last"),
            Some(_) => None,
            None => (self.arch_bool("attention.causal") == Some(false)).then_some("mean"),
        }
    }

    /// `general.file_type` as llama.cpp names it (`Q4_K_M`…).
    pub fn file_type(&self) -> Option<String> {
        self.uint("general.file_type").map(file_type_name)
    }
}

/// llama.cpp's `general.file_type` numbers.
pub fn file_type_name(n: u64) -> String {
    let name = match n {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        32 => "BF16",
        38 => "MXFP4_MOE",
        _ => return format!("file type {n}"),
    };
    name.to_string()
}

struct Reader<'a, R> {
    r: R,
    path: &'a Path,
    pos: u64,
}

impl<R: Read> Reader<'_, R> {
    fn bad(&self, why: impl Into<String>) -> GgufError {
        GgufError::Malformed {
            path: self.path.to_path_buf(),
            why: why.into(),
        }
    }

    fn cut_short(&self) -> GgufError {
        GgufError::CutShort {
            path: self.path.to_path_buf(),
            at: self.pos,
        }
    }

    fn bytes<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut b = [0u8; N];
        self.r.read_exact(&mut b).map_err(|_| self.cut_short())?;
        self.pos += N as u64;
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
        if len > 1 << 26 {
            return Err(self.bad(format!("a string of {len} bytes at byte {}", self.pos)));
        }
        let mut s = vec![0u8; len as usize];
        self.r.read_exact(&mut s).map_err(|_| self.cut_short())?;
        self.pos += len;
        Ok(String::from_utf8_lossy(&s).into_owned())
    }

    /// The vocabulary's array: read like any array, keeping the markers.
    fn tokens(&mut self, markers: &mut std::collections::BTreeSet<String>) -> Result<Value> {
        let elem_type = self.u32()?;
        let len = self.u64()?;
        for _ in 0..len {
            match self.value(elem_type, 1)? {
                Value::Str(s)
                    if s.len() <= MARKER_BYTES
                        && s.starts_with('<')
                        && s.ends_with('>')
                        && markers.len() < MARKERS =>
                {
                    markers.insert(s);
                }
                _ => {}
            }
        }
        Ok(Value::Array { elem_type, len })
    }

    /// Reads one value of GGUF type `ty`; array elements are read and dropped.
    fn value(&mut self, ty: u32, depth: u32) -> Result<Value> {
        Ok(match ty {
            0 => Value::Uint(u64::from(self.bytes::<1>()?[0])),
            1 => Value::Int(i64::from(i8::from_le_bytes(self.bytes()?))),
            2 => Value::Uint(u64::from(u16::from_le_bytes(self.bytes()?))),
            3 => Value::Int(i64::from(i16::from_le_bytes(self.bytes()?))),
            4 => Value::Uint(u64::from(self.u32()?)),
            5 => Value::Int(i64::from(i32::from_le_bytes(self.bytes()?))),
            6 => Value::Float(f64::from(f32::from_le_bytes(self.bytes()?))),
            7 => Value::Bool(self.bytes::<1>()?[0] != 0),
            8 => Value::Str(self.string()?),
            9 => {
                let elem_type = self.u32()?;
                let len = self.u64()?;
                if depth > 0 {
                    return Err(self.bad("nested arrays"));
                }
                // Kept up to a size no vocabulary reaches, so a hostile file
                // cannot make the reader hold more than a few MiB.
                let integers = matches!(elem_type, 0..=5 | 10 | 11) && len <= 1 << 22;
                let mut ints = Vec::new();
                for _ in 0..len {
                    match self.value(elem_type, depth + 1)? {
                        Value::Uint(u) if integers => {
                            ints.push(i64::try_from(u).unwrap_or(i64::MAX))
                        }
                        Value::Int(i) if integers => ints.push(i),
                        _ => {}
                    }
                }
                if integers {
                    Value::Ints(ints)
                } else {
                    Value::Array { elem_type, len }
                }
            }
            10 => Value::Uint(self.u64()?),
            11 => Value::Int(i64::from_le_bytes(self.bytes()?)),
            12 => Value::Float(f64::from_le_bytes(self.bytes()?)),
            _ => return Err(self.bad(format!("unknown metadata value type {ty}"))),
        })
    }
}

/// Writes a minimal GGUF file (for tests of code that reads headers).
pub mod testing {
    /// Writes `meta` to `path` as a GGUF with one small tensor, for tests
    /// that read metadata only; returns `path`.
    pub fn write_gguf(path: &std::path::Path, meta: &[(&str, MetaValue)]) -> std::path::PathBuf {
        if let Err(e) = std::fs::write(path, gguf_bytes(meta, &[("token_embd.weight", &[8, 8])])) {
            panic!("write {}: {e}", path.display());
        }
        path.to_path_buf()
    }

    /// A GGUF v3 header with string / u32 metadata and F32 tensors of the
    /// given shapes, their data zero-filled.
    pub fn gguf_bytes(meta: &[(&str, MetaValue)], tensors: &[(&str, &[u64])]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(b"GGUF");
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        b.extend_from_slice(&(meta.len() as u64).to_le_bytes());
        let string = |b: &mut Vec<u8>, s: &str| {
            b.extend_from_slice(&(s.len() as u64).to_le_bytes());
            b.extend_from_slice(s.as_bytes());
        };
        for (k, v) in meta {
            string(&mut b, k);
            match v {
                MetaValue::Str(s) => {
                    b.extend_from_slice(&8u32.to_le_bytes());
                    string(&mut b, s);
                }
                MetaValue::U32(n) => {
                    b.extend_from_slice(&4u32.to_le_bytes());
                    b.extend_from_slice(&n.to_le_bytes());
                }
                MetaValue::F32(x) => {
                    b.extend_from_slice(&6u32.to_le_bytes());
                    b.extend_from_slice(&x.to_le_bytes());
                }
            }
        }
        let mut offset = 0u64;
        for (name, dims) in tensors {
            string(&mut b, name);
            b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in *dims {
                b.extend_from_slice(&d.to_le_bytes());
            }
            b.extend_from_slice(&0u32.to_le_bytes());
            b.extend_from_slice(&offset.to_le_bytes());
            let bytes = dims.iter().product::<u64>() * 4;
            offset += bytes.div_ceil(32) * 32;
        }
        while b.len() % 32 != 0 {
            b.push(0);
        }
        b.resize(b.len() + offset as usize, 0);
        b
    }

    pub enum MetaValue {
        Str(&'static str),
        U32(u32),
        F32(f32),
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{gguf_bytes, MetaValue};
    use super::*;

    fn write(name: &str, bytes: &[u8]) -> PathBuf {
        let p = std::env::temp_dir().join(format!("shoal-gguf-{}-{name}", std::process::id()));
        std::fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn reads_metadata_and_tensor_table() {
        let bytes = gguf_bytes(
            &[
                ("general.architecture", MetaValue::Str("llama")),
                ("llama.context_length", MetaValue::U32(8192)),
                ("general.file_type", MetaValue::U32(15)),
                ("general.sampling.temp", MetaValue::F32(0.5)),
            ],
            &[
                ("token_embd.weight", &[64, 10]),
                ("output_norm.weight", &[64]),
            ],
        );
        let p = write("ok.gguf", &bytes);
        let h = Header::read(&p).unwrap();
        assert_eq!(h.architecture(), Some("llama"));
        assert_eq!(h.arch_uint("context_length"), Some(8192));
        assert_eq!(h.file_type().as_deref(), Some("Q4_K_M"));
        assert_eq!(h.float("general.sampling.temp"), Some(0.5));
        assert_eq!(h.tensors.len(), 2);
        assert_eq!(h.tensors[0].elements(), 640);
        assert_eq!(h.tensors[1].offset, 2560);
        assert_eq!(h.data_offset % 32, 0);
        assert_eq!(h.file_len, bytes.len() as u64);
        std::fs::remove_file(p).ok();
    }

    #[test]
    fn truncated_and_foreign_files_are_errors_not_panics() {
        let bytes = gguf_bytes(
            &[("general.architecture", MetaValue::Str("llama"))],
            &[("a", &[4, 4])],
        );
        for cut in [3, 10, 30, 60] {
            let p = write(&format!("cut{cut}.gguf"), &bytes[..cut]);
            let e = Header::read(&p).unwrap_err().to_string();
            assert!(e.contains("cut short") || e.contains("not a GGUF"), "{e}");
            std::fs::remove_file(p).ok();
        }
        let p = write("foreign.gguf", b"PK\x03\x04 this is a zip");
        assert!(Header::read(&p)
            .unwrap_err()
            .to_string()
            .contains("not a GGUF"));
        std::fs::remove_file(p).ok();
        // A count no file of this size can hold.
        let mut lying = bytes.clone();
        lying[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        let p = write("lying.gguf", &lying);
        assert!(Header::read(&p).unwrap_err().to_string().contains("claims"));
        std::fs::remove_file(p).ok();
    }
}
