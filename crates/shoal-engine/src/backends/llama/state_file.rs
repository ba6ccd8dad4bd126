//! The layout of llama.cpp's sequence state file (what
//! `llama_state_seq_save_file` writes, format 4), read so the disk tier can
//! keep it in blocks of positions.
//!
//! The file is: magic, version, the token count and tokens; then the KV
//! cache's part: its stream count, and for the one stream that holds the
//! sequence its cell count, one meta row per cell (position, sequence count,
//! sequence id) and the data: a small header, each layer's key rows, and
//! each layer's values, as rows per cell or, when values are transposed, as
//! one run per element of the value vector. Anything else (cell extras of
//! M-RoPE models, several non-empty streams, a layer without values, any
//! byte left over) is not read, and the payload is kept whole.
use crate::disk_cache::{Layout, Piece};

const MAGIC: u32 = 0x6767_7371; // 'ggsq'
const VERSION: u32 = 4;
/// A cell's meta row: position, sequence count (1), sequence id.
const CELL_META: usize = 12;

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let b = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(b)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Option<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Some(u64::from_le_bytes(a))
    }
    /// The bytes read since `from`, as a fixed piece.
    fn fixed(&self, from: usize) -> Piece {
        Piece::Fixed(self.bytes[from..self.at].to_vec())
    }
}

/// What `llama_state_seq_get_data` puts before a sequence's state, and so
/// what its setter reads first (the source sequence id follows).
const IO_MAGIC: u32 = 0xaf14_3cd8;

/// The in-memory form of the sequence state in a state file's bytes, for
/// `llama_state_seq_set_data`, if the file holds exactly `tokens`: no temporary
/// file is written to restore a payload joined from blocks.
pub fn sequence_state(file: &[u8], tokens: &[u32]) -> Result<Vec<u8>, String> {
    let mut c = Cursor { bytes: file, at: 0 };
    if c.u32() != Some(MAGIC) || c.u32() != Some(VERSION) {
        return Err("not a llama.cpp sequence state of this version".into());
    }
    let n = c.u32().ok_or("truncated state")? as usize;
    if n != tokens.len() {
        return Err(format!(
            "the stored state holds {n} tokens, not {}",
            tokens.len()
        ));
    }
    for &t in tokens {
        if c.u32() != Some(t) {
            return Err("the stored state holds other tokens".into());
        }
    }
    let body = &file[c.at..];
    let mut out = Vec::with_capacity(8 + body.len());
    out.extend_from_slice(&IO_MAGIC.to_le_bytes());
    out.extend_from_slice(&0i32.to_le_bytes());
    out.extend_from_slice(body);
    Ok(out)
}

/// The header read since `at` as a fixed piece, then `n` rows of `width`
/// bytes in cell order.
fn cell_rows(
    c: &mut Cursor<'_>,
    pieces: &mut Vec<Piece>,
    at: usize,
    width: usize,
    n: usize,
) -> Option<()> {
    pieces.push(c.fixed(at));
    c.take(width.checked_mul(n)?)?;
    pieces.push(Piece::Rows { width, cells: true });
    Some(())
}

/// The layout of a sequence state file, or `None` if it is not exactly one
/// of the shape described above.
pub fn layout(bytes: &[u8]) -> Option<Layout> {
    let mut c = Cursor { bytes, at: 0 };
    if c.u32()? != MAGIC || c.u32()? != VERSION {
        return None;
    }
    let mut pieces = vec![c.fixed(0), Piece::Count];
    let n = c.u32()? as usize;
    c.take(n.checked_mul(4)?)?;
    pieces.push(Piece::Rows {
        width: 4,
        cells: false,
    });
    let at = c.at;
    let streams = c.u32()?;
    pieces.push(c.fixed(at));
    let mut order = None;
    let mut found = false;
    for _ in 0..streams {
        let at = c.at;
        let cells = c.u32()? as usize;
        if cells == 0 {
            pieces.push(c.fixed(at));
            continue;
        }
        if found || cells != n {
            return None;
        }
        found = true;
        pieces.push(Piece::Count);
        // Row r holds the cell of some position; every position once.
        let mut row_of = vec![u32::MAX; n];
        for r in 0..n {
            let pos = c.u32()? as usize;
            let seqs = c.u32()?;
            c.u32()?;
            if seqs != 1 || pos >= n || row_of[pos] != u32::MAX {
                return None;
            }
            row_of[pos] = r as u32;
        }
        pieces.push(Piece::Rows {
            width: CELL_META,
            cells: true,
        });
        if row_of.iter().enumerate().any(|(p, &r)| p as u32 != r) {
            order = Some(row_of);
        }
        let at = c.at;
        let v_trans = c.u32()?;
        let layers = c.u32()? as usize;
        c.u32()?; // rotated key dims
        c.u32()?; // rotated value dims
        pieces.push(c.fixed(at));
        // Each layer's keys: type and row size, then a row per cell.
        for _ in 0..layers {
            let at = c.at;
            c.u32()?;
            let row = usize::try_from(c.u64()?).ok()?;
            cell_rows(&mut c, &mut pieces, at, row, n)?;
        }
        // Each layer's values: as rows per cell, or transposed, one run of
        // an element per cell for each element of the value vector.
        for _ in 0..layers {
            let at = c.at;
            c.u32()?;
            if v_trans == 0 {
                let row = usize::try_from(c.u64()?).ok()?;
                cell_rows(&mut c, &mut pieces, at, row, n)?;
            } else {
                let element = c.u32()? as usize;
                let elements = c.u32()? as usize;
                pieces.push(c.fixed(at));
                for _ in 0..elements {
                    c.take(element.checked_mul(n)?)?;
                    pieces.push(Piece::Rows {
                        width: element,
                        cells: true,
                    });
                }
            }
        }
    }
    if !found
        || c.at != bytes.len()
        || pieces
            .iter()
            .any(|p| matches!(p, Piece::Rows { width: 0, .. }))
    {
        return None;
    }
    Some(Layout {
        pieces,
        rows: n,
        order,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state file of `n` positions whose cells are stored in `rows` order
    /// (cell r holds position rows[r]), with two layers of 4-byte key rows
    /// and values either as rows or transposed (3 elements of 2 bytes).
    fn file(n: usize, rows: &[u32], v_trans: bool) -> Vec<u8> {
        let mut b = Vec::new();
        let w = |b: &mut Vec<u8>, x: u32| b.extend_from_slice(&x.to_le_bytes());
        w(&mut b, MAGIC);
        w(&mut b, VERSION);
        w(&mut b, n as u32);
        for t in 0..n {
            w(&mut b, 1000 + t as u32);
        }
        w(&mut b, 2); // streams: this one and an empty one
        w(&mut b, n as u32);
        for &pos in rows {
            w(&mut b, pos);
            w(&mut b, 1);
            w(&mut b, 3);
        }
        for x in [u32::from(v_trans), 2, 0, 0] {
            w(&mut b, x);
        }
        for layer in 0..2u8 {
            w(&mut b, 1);
            b.extend_from_slice(&4u64.to_le_bytes());
            for &pos in rows {
                b.extend_from_slice(&[layer, pos as u8, (pos >> 8) as u8, 0xaa]);
            }
        }
        for layer in 0..2u8 {
            w(&mut b, 1);
            if v_trans {
                w(&mut b, 2);
                w(&mut b, 3);
                for el in 0..3u8 {
                    for &pos in rows {
                        b.extend_from_slice(&[layer * 16 + el, pos as u8]);
                    }
                }
            } else {
                b.extend_from_slice(&6u64.to_le_bytes());
                for &pos in rows {
                    b.extend_from_slice(&[layer, pos as u8, 1, 2, 3, 4]);
                }
            }
        }
        w(&mut b, 0); // the empty stream
        b
    }

    #[test]
    fn a_state_file_is_read_in_any_cell_order_and_joins_back_in_position_order() {
        let n = 300;
        let ordered: Vec<u32> = (0..n as u32).collect();
        // Cells reused out of order: the second half first.
        let scrambled: Vec<u32> = (150..n as u32).chain(0..150).collect();
        for v_trans in [false, true] {
            let straight = file(n, &ordered, v_trans);
            let l = layout(&straight).expect("reads");
            assert_eq!((l.rows, l.order.is_none()), (n, true));
            let shuffled = file(n, &scrambled, v_trans);
            let s = layout(&shuffled).expect("reads");
            assert!(s.order.is_some());
            // Cut and joined back, the scrambled file is the ordered one
            // (seq ids and all), and its blocks are the ordered file's.
            let blocks = s.split(&shuffled, 256).expect("splits");
            assert_eq!(blocks, l.split(&straight, 256).expect("splits"));
            let parts: Vec<(usize, &[u8])> = vec![(256, &blocks[0]), (44, &blocks[1])];
            assert_eq!(
                s.join(&parts).expect("joins"),
                straight,
                "v_trans {v_trans}"
            );
        }
    }

    #[test]
    fn a_state_file_becomes_the_setter_s_state_only_for_its_own_tokens() {
        let rows: Vec<u32> = (0..20).collect();
        let f = file(20, &rows, false);
        let tokens: Vec<u32> = (1000..1020).collect();
        let state = sequence_state(&f, &tokens).expect("its tokens");
        assert_eq!(&state[..4], &IO_MAGIC.to_le_bytes());
        // The state part follows the header and the 20 tokens.
        assert_eq!(&state[8..], &f[12 + 80..]);
        assert!(sequence_state(&f, &tokens[..19]).is_err(), "fewer tokens");
        let mut other = tokens.clone();
        other[7] = 5;
        assert!(sequence_state(&f, &other).is_err(), "another token");
        assert!(sequence_state(&f[..50], &tokens).is_err(), "cut short");
    }

    #[test]
    fn anything_off_the_known_shape_is_not_read() {
        let rows: Vec<u32> = (0..20).collect();
        let good = file(20, &rows, true);
        assert!(layout(&good).is_some());
        let mut longer = good.clone();
        longer.push(0);
        assert!(layout(&longer).is_none(), "a byte left over");
        assert!(layout(&good[..good.len() - 1]).is_none(), "cut short");
        let mut version = good.clone();
        version[4] = 5;
        assert!(layout(&version).is_none(), "another format");
        let twice: Vec<u32> = (0..19).chain([3]).collect();
        assert!(
            layout(&file(20, &twice, true)).is_none(),
            "a position twice"
        );
    }
}
