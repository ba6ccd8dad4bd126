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
use crate::disk_cache::layout::{Layout, Piece, Reader};

const MAGIC: u32 = 0x6767_7371; // 'ggsq'
const VERSION: u32 = 4;
/// A cell's meta row: position, sequence count (1), sequence id.
const CELL_META: usize = 12;

/// What `llama_state_seq_get_data` puts before a sequence's state, and so
/// what its setter reads first (the source sequence id follows).
const IO_MAGIC: u32 = 0xaf14_3cd8;

/// The in-memory form of the sequence state in a state file's bytes, for
/// `llama_state_seq_set_data`, if the file holds exactly `tokens`: no temporary
/// file is written to restore a payload joined from blocks.
pub fn sequence_state(file: &[u8], tokens: &[u32]) -> Result<Vec<u8>, String> {
    let mut r = Reader::new(file);
    if r.u32()? != MAGIC || r.u32()? != VERSION {
        return Err("not a llama.cpp sequence state of this version".into());
    }
    let n = r.u32()? as usize;
    if n != tokens.len() {
        return Err(format!(
            "the stored state holds {n} tokens, not {}",
            tokens.len()
        ));
    }
    for &t in tokens {
        if r.u32()? != t {
            return Err("the stored state holds other tokens".into());
        }
    }
    let body = r.rest();
    let mut out = Vec::with_capacity(8 + body.len());
    out.extend_from_slice(&IO_MAGIC.to_le_bytes());
    out.extend_from_slice(&0i32.to_le_bytes());
    out.extend_from_slice(body);
    Ok(out)
}

/// The header read since `at` as a fixed piece, then `n` rows of `width`
/// bytes (a run of `width`-byte rows, one per cell).
fn cell_rows(
    r: &mut Reader<'_>,
    pieces: &mut Vec<Piece>,
    at: usize,
    width: usize,
    n: usize,
) -> Result<(), String> {
    pieces.push(Piece::Fixed(r.since(at).to_vec()));
    r.take(width.checked_mul(n).ok_or("rows overflow")?)?;
    pieces.push(Piece::Rows { width, cells: true });
    Ok(())
}

/// The layout of a sequence state file, or `None` if it is not exactly one
/// of the shape described above.
pub fn layout(bytes: &[u8]) -> Option<Layout> {
    match read_layout(bytes) {
        Ok(l) => Some(l),
        Err(why) => {
            tracing::debug!(why, "a llama.cpp state kept whole");
            None
        }
    }
}

fn read_layout(bytes: &[u8]) -> Result<Layout, String> {
    let mut r = Reader::new(bytes);
    if r.u32()? != MAGIC || r.u32()? != VERSION {
        return Err("another format".into());
    }
    let mut pieces = vec![Piece::Fixed(r.since(0).to_vec()), Piece::Count];
    let n = r.u32()? as usize;
    // The token list, in position order (not cell order).
    r.take(n.checked_mul(4).ok_or("rows overflow")?)?;
    pieces.push(Piece::Rows {
        width: 4,
        cells: false,
    });
    let at = r.at;
    let streams = r.u32()?;
    pieces.push(Piece::Fixed(r.since(at).to_vec()));
    let mut order = None;
    let mut found = false;
    for _ in 0..streams {
        let at = r.at;
        let cells = r.u32()? as usize;
        if cells == 0 {
            pieces.push(Piece::Fixed(r.since(at).to_vec()));
            continue;
        }
        if found || cells != n {
            return Err("several streams, or not one cell a token".into());
        }
        found = true;
        pieces.push(Piece::Count);
        // Row k holds the cell of some position; every position once.
        let mut row_of = vec![u32::MAX; n];
        for k in 0..n {
            let pos = r.u32()? as usize;
            let seqs = r.u32()?;
            r.u32()?;
            if seqs != 1 || pos >= n || row_of[pos] != u32::MAX {
                return Err("cells that are not one position each".into());
            }
            row_of[pos] = k as u32;
        }
        pieces.push(Piece::Rows {
            width: CELL_META,
            cells: true,
        });
        if row_of.iter().enumerate().any(|(p, &k)| p as u32 != k) {
            order = Some(row_of);
        }
        let at = r.at;
        let v_trans = r.u32()?;
        let layers = r.u32()? as usize;
        r.u32()?; // rotated key dims
        r.u32()?; // rotated value dims
        pieces.push(Piece::Fixed(r.since(at).to_vec()));
        // Each layer's keys: type and row size, then a row per cell.
        for _ in 0..layers {
            let at = r.at;
            r.u32()?;
            let row = usize::try_from(r.u64()?).map_err(|e| e.to_string())?;
            cell_rows(&mut r, &mut pieces, at, row, n)?;
        }
        // Each layer's values: as rows per cell, or transposed, one run of
        // an element per cell for each element of the value vector.
        for _ in 0..layers {
            let at = r.at;
            r.u32()?;
            if v_trans == 0 {
                let row = usize::try_from(r.u64()?).map_err(|e| e.to_string())?;
                cell_rows(&mut r, &mut pieces, at, row, n)?;
            } else {
                let element = r.u32()? as usize;
                let elements = r.u32()? as usize;
                pieces.push(Piece::Fixed(r.since(at).to_vec()));
                for _ in 0..elements {
                    r.take(element.checked_mul(n).ok_or("rows overflow")?)?;
                    pieces.push(Piece::Rows {
                        width: element,
                        cells: true,
                    });
                }
            }
        }
    }
    if !found || !r.rest().is_empty() {
        return Err("no sequence, or bytes left over".into());
    }
    if pieces
        .iter()
        .any(|p| matches!(p, Piece::Rows { width: 0, .. }))
    {
        return Err("rows of no width".into());
    }
    Ok(Layout {
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
