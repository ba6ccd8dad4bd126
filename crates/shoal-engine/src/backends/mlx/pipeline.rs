//! One model split by layers over several processes (usually machines),
//! talking through MLX's own distributed backend (the ring backend over
//! TCP: `MLX_HOSTFILE` lists every rank's address, `MLX_RANK` says which one
//! a process is). No tensor transport of our own: hidden states and logits
//! move with `mlx_distributed_send` / `recv`.
//!
//! Rank 0 embeds the tokens, runs the first layers and is the engine's
//! `LanguageModel`: the scheduler, sampling, detokenizing, stop sequences
//! and accounting run there unchanged. Each later rank runs its layers in
//! [`serve_stage`]; the last one also applies the final norm and head and
//! sends the logits back to rank 0. Every message starts with a small
//! header saying what to do with which sequence's KV cache.
use std::any::Any;
use std::collections::HashMap;
use std::ffi::CString;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use mlx_rs::{Array, Dtype, Stream};

use crate::backend::{downcast, CacheRows, DecodeBatch, KvCache, LanguageModel, ModelInfo};
use crate::backends::mlx::{MlxCache, Transformer};
use crate::error::{EngineError, Result};

/// A process's membership in MLX's distributed group.
pub struct Group {
    g: mlx_sys::mlx_distributed_group,
}

// The group handle is only used from the engine thread that created it.
unsafe impl Send for Group {}
unsafe impl Sync for Group {}

fn backend_err(what: &str) -> EngineError {
    EngineError::Backend(format!("distributed {what} failed (a rank may have gone)"))
}

impl Group {
    /// Joins the ring described by `MLX_HOSTFILE` and `MLX_RANK`; returns once
    /// every rank has connected.
    pub fn init_ring() -> Result<Group> {
        let bk = CString::new("ring").map_err(|e| EngineError::Backend(e.to_string()))?;
        // SAFETY: plain C calls; `g` is written by init before use.
        unsafe {
            if !mlx_sys::mlx_distributed_is_available(bk.as_ptr()) {
                return Err(EngineError::Unsupported(
                    "MLX was built without its ring backend".into(),
                ));
            }
            let mut g = mlx_sys::mlx_distributed_group_new();
            if mlx_sys::mlx_distributed_init(&mut g, true, bk.as_ptr()) != 0 || g.ctx.is_null() {
                return Err(backend_err("init (check MLX_HOSTFILE / MLX_RANK)"));
            }
            Ok(Group { g })
        }
    }

    pub fn rank(&self) -> usize {
        // SAFETY: a live group.
        unsafe { mlx_sys::mlx_distributed_group_rank(self.g).max(0) as usize }
    }

    pub fn size(&self) -> usize {
        // SAFETY: a live group.
        unsafe { mlx_sys::mlx_distributed_group_size(self.g).max(0) as usize }
    }

    /// Sends `x` to rank `dst` and waits until it is sent.
    pub fn send(&self, x: &Array, dst: usize) -> Result<()> {
        // SAFETY: `x`, the group and the stream are live handles.
        self.evaluated("send", |res, stream| unsafe {
            mlx_sys::mlx_distributed_send(res, x.as_ptr(), dst as i32, self.g, stream)
        })
        .map(drop)
    }

    /// Receives an array of `shape` and `dtype` from rank `src`.
    pub fn recv(&self, shape: &[i32], dtype: Dtype, src: usize) -> Result<Array> {
        let dtype = dtype as mlx_sys::mlx_dtype;
        // SAFETY: `shape` outlives the call; the group and the stream are live.
        self.evaluated("recv", |res, stream| unsafe {
            let (n, dims) = (shape.len(), shape.as_ptr());
            mlx_sys::mlx_distributed_recv(res, dims, n, dtype, src as i32, self.g, stream)
        })
    }

    /// Runs one distributed op on the CPU stream into a fresh array handle
    /// (owned by the returned `Array` whatever the outcome) and evaluates it,
    /// so the transfer has happened when this returns.
    fn evaluated(
        &self,
        op: &str,
        call: impl FnOnce(&mut mlx_sys::mlx_array, mlx_sys::mlx_stream) -> std::os::raw::c_int,
    ) -> Result<Array> {
        let stream = Stream::cpu();
        // SAFETY: `res` is a fresh handle the call fills; ownership passes to `Array`.
        let (rc, out) = unsafe {
            let mut res = mlx_sys::mlx_array_new();
            let rc = call(&mut res, stream.as_ptr());
            (rc, Array::from_ptr(res))
        };
        if rc != 0 {
            return Err(backend_err(op));
        }
        out.eval().map_err(|_| backend_err(op))?;
        Ok(out)
    }

    fn send_header(&self, h: Header, dst: usize) -> Result<()> {
        self.send(&Array::from_slice(&h.encode(), &[4]), dst)
    }

    fn recv_header(&self, src: usize) -> Result<Header> {
        let a = self.recv(&[4], Dtype::Int32, src)?;
        Header::decode(a.as_slice::<i32>())
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: freed once.
        unsafe {
            mlx_sys::mlx_distributed_group_free(self.g);
        }
    }
}

/// What a stage is asked to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Header {
    Stop,
    /// Run `n` positions of sequence `seq` (hidden states follow).
    Forward {
        seq: i32,
        n: i32,
    },
    Truncate {
        seq: i32,
        len: i32,
    },
    Drop {
        seq: i32,
    },
    Clone {
        from: i32,
        to: i32,
    },
}

impl Header {
    fn encode(self) -> [i32; 4] {
        match self {
            Header::Stop => [0, 0, 0, 0],
            Header::Forward { seq, n } => [1, seq, n, 0],
            Header::Truncate { seq, len } => [2, seq, len, 0],
            Header::Drop { seq } => [3, seq, 0, 0],
            Header::Clone { from, to } => [4, from, 0, to],
        }
    }

    fn decode(v: &[i32]) -> Result<Header> {
        Ok(match v {
            [0, ..] => Header::Stop,
            [1, seq, n, _] => Header::Forward { seq: *seq, n: *n },
            [2, seq, len, _] => Header::Truncate {
                seq: *seq,
                len: *len,
            },
            [3, seq, ..] => Header::Drop { seq: *seq },
            [4, from, _, to] => Header::Clone {
                from: *from,
                to: *to,
            },
            other => {
                return Err(EngineError::Backend(format!(
                    "pipeline: unknown message {other:?}"
                )))
            }
        })
    }
}

/// The ranks a stage talks to.
struct Link {
    group: Group,
    next_seq: AtomicI32,
}

impl Link {
    fn last_rank(&self) -> usize {
        self.group.size() - 1
    }
}

/// Rank 0: the first layers here, the rest on the other ranks.
pub struct PipelineModel {
    stage: Transformer,
    link: Arc<Link>,
    info: ModelInfo,
}

impl PipelineModel {
    /// `stage` holds this rank's layers (the first ones); `group` the joined ring.
    pub fn new(stage: Transformer, group: Group) -> Result<Self> {
        if group.rank() != 0 || group.size() < 2 {
            return Err(EngineError::InvalidRequest(format!(
                "the pipeline's entry must be rank 0 of at least 2 (is {} of {})",
                group.rank(),
                group.size()
            )));
        }
        let info = stage.info().clone();
        Ok(PipelineModel {
            stage,
            link: Arc::new(Link {
                group,
                next_seq: AtomicI32::new(1),
            }),
            info,
        })
    }

    /// Tells the other ranks to end their loops.
    pub fn stop(&self) -> Result<()> {
        self.link.group.send_header(Header::Stop, 1)
    }
}

/// A sequence's cache: this rank's layers here, the others' on their ranks
/// under the same sequence number.
struct PipeCache {
    seq: i32,
    local: MlxCache,
    link: Arc<Link>,
}

impl KvCache for PipeCache {
    fn len(&self) -> usize {
        self.local.len()
    }
    fn truncate(&mut self, len: usize) {
        self.local.truncate(len);
        let h = Header::Truncate {
            seq: self.seq,
            len: len as i32,
        };
        if let Err(e) = self.link.group.send_header(h, 1) {
            tracing::warn!(error = %e, "pipeline truncate not sent");
        }
    }
    fn nbytes(&self) -> usize {
        self.local.nbytes()
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn clone_box(&self) -> Box<dyn KvCache> {
        let to = self.link.next_seq.fetch_add(1, Ordering::Relaxed);
        let h = Header::Clone { from: self.seq, to };
        if let Err(e) = self.link.group.send_header(h, 1) {
            tracing::warn!(error = %e, "pipeline clone not sent");
        }
        Box::new(PipeCache {
            seq: to,
            local: self.local.clone(),
            link: self.link.clone(),
        })
    }
}

impl Drop for PipeCache {
    fn drop(&mut self) {
        let _ = self
            .link
            .group
            .send_header(Header::Drop { seq: self.seq }, 1);
    }
}

impl LanguageModel for PipelineModel {
    fn turn(&self) -> crate::backend::Turn {
        Some(super::turns::mlx_turn())
    }

    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_cache(&self) -> Result<Box<dyn KvCache>> {
        Ok(Box::new(PipeCache {
            seq: self.link.next_seq.fetch_add(1, Ordering::Relaxed),
            local: MlxCache::default(),
            link: self.link.clone(),
        }))
    }

    fn forward(&self, tokens: &[u32], cache: &mut dyn KvCache) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(EngineError::InvalidRequest("no tokens to run".into()));
        }
        let cache: &mut PipeCache = downcast(cache.as_any_mut(), "KV cache")?;
        if cache.local.len() + tokens.len() > self.info.context_length {
            return Err(EngineError::ContextOverflow {
                prompt_tokens: cache.local.len() + tokens.len(),
                context: self.info.context_length,
            });
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= self.info.vocab_size) {
            return Err(EngineError::InvalidRequest(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.info.vocab_size
            )));
        }
        let h = self.stage.embed_tokens(tokens)?;
        let h = self.stage.run_layers(h, &mut cache.local)?;
        let g = &self.link.group;
        g.send_header(
            Header::Forward {
                seq: cache.seq,
                n: tokens.len() as i32,
            },
            1,
        )?;
        g.send(&h, 1)?;
        let logits = g.recv(
            &[self.info.vocab_size as i32],
            Dtype::Float32,
            self.link.last_rank(),
        )?;
        Ok(logits.as_slice::<f32>().to_vec())
    }

    fn new_batch(&self) -> Result<Box<dyn DecodeBatch>> {
        // Rows decoded one after another: each token crosses every rank anyway.
        Ok(Box::new(CacheRows::default()))
    }

    fn forward_batch(&self, tokens: &[u32], batch: &mut dyn DecodeBatch) -> Result<Vec<Vec<f32>>> {
        tokens
            .iter()
            .zip(CacheRows::of(batch, tokens)?.rows.iter_mut())
            .map(|(&t, cache)| self.forward(&[t], cache.as_mut()))
            .collect()
    }
}

/// A rank after the first: runs its layers for every message until told to
/// stop (or the ring breaks). The last rank sends logits back to rank 0.
pub fn serve_stage(stage: Transformer, group: Group) -> Result<()> {
    let rank = group.rank();
    let size = group.size();
    if rank == 0 || size < 2 {
        return Err(EngineError::InvalidRequest(
            "serve_stage is for ranks after the first".into(),
        ));
    }
    let prev = rank - 1;
    let last = rank == size - 1;
    let next = (rank + 1) % size;
    let hidden = stage.info().hidden_size as i32;
    let mut caches: HashMap<i32, MlxCache> = HashMap::new();
    loop {
        let header = group.recv_header(prev)?;
        match header {
            Header::Stop => {
                if !last {
                    group.send_header(header, next)?;
                }
                return Ok(());
            }
            Header::Forward { seq, n } => {
                let h = group.recv(&[1, n, hidden], stage.dtype(), prev)?;
                let cache = caches.entry(seq).or_default();
                let h = stage.run_layers(h, cache)?;
                if last {
                    let logits = stage.logits_last(&h)?;
                    group.send(&logits.reshape(&[-1])?, 0)?;
                } else {
                    group.send_header(header, next)?;
                    group.send(&h, next)?;
                }
                continue;
            }
            Header::Truncate { seq, len } => {
                if let Some(c) = caches.get_mut(&seq) {
                    c.truncate(len.max(0) as usize);
                }
            }
            Header::Drop { seq } => {
                caches.remove(&seq);
            }
            Header::Clone { from, to } => {
                let copy = caches.get(&from).cloned().unwrap_or_default();
                caches.insert(to, copy);
            }
        }
        if !last {
            group.send_header(header, next)?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip() {
        for h in [
            Header::Stop,
            Header::Forward { seq: 3, n: 17 },
            Header::Truncate { seq: 2, len: 9 },
            Header::Drop { seq: 5 },
            Header::Clone { from: 1, to: 8 },
        ] {
            assert_eq!(Header::decode(&h.encode()).unwrap(), h);
        }
        assert!(Header::decode(&[9, 0, 0, 0]).is_err());
    }
}
