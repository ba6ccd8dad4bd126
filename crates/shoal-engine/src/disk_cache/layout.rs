//! How a backend's payload file is laid out by position, so the disk tier
//! can cut it into blocks of [`BLOCK_TOKENS`](super::BLOCK_TOKENS) positions
//! and join any leading run of blocks back into a payload the backend reads.
//!
//! Both backends write a sequence's state layer by layer: a few header
//! fields, then for each layer (and head, or element) one row per position.
//! A [`Layout`] names those parts. A block holds, for every [`Piece::Rows`]
//! in order, the rows of its positions; the fixed parts are kept once, in the
//! entry's meta. Two prompts that share a prefix then share its blocks on
//! disk, and a hit shorter than its entry reads only the blocks it needs.
//!
//! The backend's parser reads the layout from a payload it has just written
//! and refuses anything it does not understand exactly (every byte must be
//! accounted for), so a changed upstream format falls back to whole-payload
//! entries instead of being cut wrongly.

/// A little-endian reader over bytes: the tier's metas and blocks, a
/// layout's pieces, and the backends' layout readers. Reading past the end
/// is an error ("truncated"), never a panic.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    /// How many bytes have been read.
    pub(crate) at: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, at: 0 }
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let b = self
            .at
            .checked_add(n)
            .and_then(|end| self.bytes.get(self.at..end))
            .ok_or("truncated")?;
        self.at += n;
        Ok(b)
    }

    pub(crate) fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, String> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }

    /// A length-prefixed UTF-8 string.
    pub(crate) fn string(&mut self) -> Result<String, String> {
        let n = self.u32()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| "bad text".to_string())
    }

    /// The bytes read since offset `from`.
    pub(crate) fn since(&self, from: usize) -> &'a [u8] {
        &self.bytes[from.min(self.at)..self.at]
    }

    /// The bytes not read yet.
    pub(crate) fn rest(&self) -> &'a [u8] {
        &self.bytes[self.at..]
    }
}

/// One part of a payload, in file order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    /// Bytes that do not depend on the positions held.
    Fixed(Vec<u8>),
    /// The number of positions, as a little-endian `u32`.
    Count,
    /// One row of `width` bytes per position. `cells` rows are stored in the
    /// backend's cell order, which [`Layout::order`] maps to positions;
    /// other rows (a token list) are already in position order.
    Rows { width: usize, cells: bool },
}

/// A payload's parts and the positions it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub pieces: Vec<Piece>,
    /// Positions held: the length of every [`Piece::Rows`].
    pub rows: usize,
    /// For position `p`, the row where its cells are stored; `None` when
    /// cells are in position order.
    pub order: Option<Vec<u32>>,
}

/// Reads the layout of a payload the backend wrote; `None` when the payload
/// is not exactly of the shape the parser knows.
pub type LayoutFn = fn(&[u8]) -> Option<Layout>;

impl Layout {
    /// Bytes of one position's rows, summed over every piece.
    pub fn row_bytes(&self) -> usize {
        self.pieces
            .iter()
            .map(|p| match p {
                Piece::Rows { width, .. } => *width,
                _ => 0,
            })
            .sum()
    }

    /// Cuts `payload` into blocks of `block` positions (the last may be
    /// shorter), each the rows of its positions in piece order; `None` if
    /// `payload` does not match the layout to the byte. (The tier cuts one
    /// block at a time through [`Layout::cutter`]; tests compare whole cuts.)
    #[cfg(test)]
    pub fn split(&self, payload: &[u8], block: usize) -> Option<Vec<Vec<u8>>> {
        let cut = self.cutter(payload)?;
        let block = block.max(1);
        Some(
            (0..self.rows)
                .step_by(block)
                .map(|first| cut.block(first, (first + block).min(self.rows)))
                .collect(),
        )
    }

    /// `payload` checked against the layout to the byte, ready to give its
    /// blocks one at a time (so a large payload is never copied whole).
    pub fn cutter<'a>(&'a self, payload: &'a [u8]) -> Option<Cutter<'a>> {
        let rows = self.rows;
        if let Some(order) = &self.order {
            if order.len() != rows || order.iter().any(|&r| r as usize >= rows) {
                return None;
            }
        }
        // Where each piece of rows starts, checking the fixed parts on the way.
        let mut starts = Vec::new();
        let mut at = 0usize;
        for p in &self.pieces {
            match p {
                Piece::Fixed(b) => {
                    if payload.get(at..at + b.len())? != b.as_slice() {
                        return None;
                    }
                    at += b.len();
                }
                Piece::Count => {
                    let c = payload.get(at..at + 4)?;
                    if u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize != rows {
                        return None;
                    }
                    at += 4;
                }
                Piece::Rows { width, cells } => {
                    starts.push((at, *width, *cells));
                    at = at.checked_add(width.checked_mul(rows)?)?;
                }
            }
        }
        (at == payload.len()).then_some(Cutter {
            layout: self,
            payload,
            starts,
        })
    }

    /// The payload holding the positions of `blocks` in turn (each block's
    /// body and its number of positions), in position order.
    pub fn join(&self, blocks: &[(usize, &[u8])]) -> Option<Vec<u8>> {
        let rows: usize = blocks.iter().map(|b| b.0).sum();
        let row_bytes = self.row_bytes();
        if blocks.iter().any(|(n, body)| n * row_bytes != body.len()) {
            return None;
        }
        let fixed: usize = self
            .pieces
            .iter()
            .map(|p| match p {
                Piece::Fixed(b) => b.len(),
                Piece::Count => 4,
                Piece::Rows { .. } => 0,
            })
            .sum();
        let mut out = Vec::with_capacity(fixed + rows * row_bytes);
        // Each block's read position: its pieces lie one after another.
        let mut cursors = vec![0usize; blocks.len()];
        for p in &self.pieces {
            match p {
                Piece::Fixed(b) => out.extend_from_slice(b),
                Piece::Count => out.extend_from_slice(&u32::try_from(rows).ok()?.to_le_bytes()),
                Piece::Rows { width, .. } => {
                    for ((n, body), at) in blocks.iter().zip(cursors.iter_mut()) {
                        let len = n * width;
                        out.extend_from_slice(&body[*at..*at + len]);
                        *at += len;
                    }
                }
            }
        }
        Some(out)
    }

    /// The pieces, written compactly for an entry's meta (runs of equal rows
    /// as one record); cell order is not kept, since blocks are in position
    /// order.
    pub fn encode_pieces(&self) -> Vec<u8> {
        let mut b = Vec::new();
        let mut i = 0;
        while i < self.pieces.len() {
            match &self.pieces[i] {
                Piece::Fixed(bytes) => {
                    b.push(0);
                    b.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
                    b.extend_from_slice(bytes);
                    i += 1;
                }
                Piece::Count => {
                    b.push(1);
                    i += 1;
                }
                Piece::Rows { width, .. } => {
                    let run = self.pieces[i..]
                        .iter()
                        .take_while(|p| matches!(p, Piece::Rows { width: w, .. } if w == width))
                        .count();
                    b.push(2);
                    b.extend_from_slice(&(*width as u32).to_le_bytes());
                    b.extend_from_slice(&(run as u32).to_le_bytes());
                    i += run;
                }
            }
        }
        b
    }

    /// Pieces written by [`Layout::encode_pieces`], as a layout of blocks in
    /// position order (`rows` 0, set by whoever joins).
    pub fn decode_pieces(b: &[u8]) -> Result<Layout, String> {
        let mut r = Reader::new(b);
        let mut pieces = Vec::new();
        while !r.rest().is_empty() {
            match r.take(1)?[0] {
                0 => {
                    let n = r.u32()? as usize;
                    pieces.push(Piece::Fixed(r.take(n)?.to_vec()));
                }
                1 => pieces.push(Piece::Count),
                2 => {
                    let width = r.u32()? as usize;
                    let run = r.u32()? as usize;
                    if width == 0 || run == 0 || run > 1 << 24 {
                        return Err("bad rows in layout".into());
                    }
                    pieces.extend((0..run).map(|_| Piece::Rows {
                        width,
                        cells: false,
                    }));
                }
                t => return Err(format!("unknown layout piece {t}")),
            }
        }
        Ok(Layout {
            pieces,
            rows: 0,
            order: None,
        })
    }
}

/// A payload checked against its [`Layout`], giving its blocks.
pub struct Cutter<'a> {
    layout: &'a Layout,
    payload: &'a [u8],
    /// Each piece of rows: where it starts, its width, whether in cell order.
    starts: Vec<(usize, usize, bool)>,
}

impl Cutter<'_> {
    /// Bytes of one position's rows.
    pub fn row_bytes(&self) -> usize {
        self.layout.row_bytes()
    }

    /// The block of positions `first..end`: for every piece of rows in
    /// turn, the rows of those positions.
    pub fn block(&self, first: usize, end: usize) -> Vec<u8> {
        // The positions as runs of consecutive stored rows: one run when
        // cells are in order, a few where a pool reused cells.
        let runs = match &self.layout.order {
            Some(order) => runs(&order[first..end]),
            None => vec![(first as u32, end - first)],
        };
        let mut body = Vec::with_capacity((end - first) * self.layout.row_bytes());
        for &(start, width, cells) in &self.starts {
            if cells {
                for &(row, n) in &runs {
                    let from = start + row as usize * width;
                    body.extend_from_slice(&self.payload[from..from + n * width]);
                }
            } else {
                body.extend_from_slice(&self.payload[start + first * width..start + end * width]);
            }
        }
        body
    }
}

/// `order` as runs of consecutive rows: (first row, length).
fn runs(order: &[u32]) -> Vec<(u32, usize)> {
    let mut out: Vec<(u32, usize)> = Vec::new();
    for &row in order {
        match out.last_mut() {
            Some((first, n)) if *first as usize + *n == row as usize => *n += 1,
            _ => out.push((row, 1)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A payload of a made-up format: a header, the count, a token row per
    /// position, then `heads` runs of 3-byte rows stored in cell order.
    fn payload(tokens: &[u32], order: &[u32], heads: usize) -> (Vec<u8>, Layout) {
        let n = tokens.len();
        let mut b = b"HEAD".to_vec();
        b.extend_from_slice(&(n as u32).to_le_bytes());
        for t in tokens {
            b.extend_from_slice(&t.to_le_bytes());
        }
        b.extend_from_slice(b"MID");
        for h in 0..heads {
            // Row r holds the cell of position order⁻¹(r).
            let mut rows = vec![[0u8; 3]; n];
            for (pos, &row) in order.iter().enumerate() {
                rows[row as usize] = [h as u8, (pos % 251) as u8, (pos / 251) as u8];
            }
            b.extend(rows.iter().flatten());
        }
        let mut pieces = vec![
            Piece::Fixed(b"HEAD".to_vec()),
            Piece::Count,
            Piece::Rows {
                width: 4,
                cells: false,
            },
            Piece::Fixed(b"MID".to_vec()),
        ];
        pieces.extend((0..heads).map(|_| Piece::Rows {
            width: 3,
            cells: true,
        }));
        let identity = order.iter().enumerate().all(|(p, &r)| p as u32 == r);
        let layout = Layout {
            pieces,
            rows: n,
            order: (!identity).then(|| order.to_vec()),
        };
        (b, layout)
    }

    #[test]
    fn blocks_join_back_into_the_payload_or_any_leading_part_of_it() {
        let tokens: Vec<u32> = (0..600).map(|t| t * 7 + 1).collect();
        // Cells stored out of position order, as a reused KV pool leaves them.
        let order: Vec<u32> = (0..600u32).map(|p| (p * 13) % 600).collect();
        let (scrambled, layout) = payload(&tokens, &order, 5);
        let blocks = layout.split(&scrambled, 256).expect("splits");
        assert_eq!(blocks.len(), 3);
        assert_eq!(blocks[2].len(), 88 * layout.row_bytes());
        let identity: Vec<u32> = (0..600).collect();
        let (straight, _) = payload(&tokens, &identity, 5);
        let stored = Layout::decode_pieces(&layout.encode_pieces()).expect("decodes");
        let parts = |k: usize| -> Vec<(usize, &[u8])> {
            blocks[..k]
                .iter()
                .enumerate()
                .map(|(i, b)| ((600 - i * 256).min(256), b.as_slice()))
                .collect()
        };
        assert_eq!(stored.join(&parts(3)).expect("joins"), straight);
        // The first two blocks are the payload of the first 512 positions.
        let (short, _) = payload(&tokens[..512], &identity[..512], 5);
        assert_eq!(stored.join(&parts(2)).expect("joins"), short);
        // A block of the wrong size is refused.
        assert!(stored.join(&[(256, &blocks[2])]).is_none());
    }

    #[test]
    fn a_payload_off_its_layout_by_a_byte_is_not_split() {
        let tokens: Vec<u32> = (0..40).collect();
        let (b, layout) = payload(&tokens, &(0..40).collect::<Vec<_>>(), 2);
        assert!(layout.split(&b, 16).is_some());
        let mut longer = b.clone();
        longer.push(0);
        assert!(layout.split(&longer, 16).is_none());
        assert!(layout.split(&b[..b.len() - 1], 16).is_none());
        let mut header = b.clone();
        header[1] ^= 1;
        assert!(layout.split(&header, 16).is_none());
        let mut count = b;
        count[4] = 41;
        assert!(layout.split(&count, 16).is_none());
    }

    #[test]
    fn encoded_pieces_round_trip_and_bad_ones_are_refused() {
        let (_, layout) = payload(&[1, 2, 3], &[0, 1, 2], 40);
        let enc = layout.encode_pieces();
        // 40 equal rows take one record.
        assert!(enc.len() < 40);
        let back = Layout::decode_pieces(&enc).expect("decodes");
        assert_eq!(back.pieces.len(), layout.pieces.len());
        assert_eq!(back.row_bytes(), layout.row_bytes());
        assert!(Layout::decode_pieces(&enc[..enc.len() - 1]).is_err());
        assert!(Layout::decode_pieces(&[9]).is_err());
    }
}
