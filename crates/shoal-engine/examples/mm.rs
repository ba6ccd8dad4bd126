extern crate shoal_engine;
use std::time::Instant;
use mlx_rs::{Array, random};
fn main() {
    for (o, i) in [(1536, 576), (49152, 576), (576, 1536)] {
        let w = random::normal::<f32>(&[o, i], None, None, None).unwrap();
        let wt = w.t().contiguous().unwrap();
        let x = random::normal::<f32>(&[1, 1, i], None, None, None).unwrap();
        mlx_rs::transforms::eval([&w, &wt, &x]).unwrap();
        let n = 200;
        let t = Instant::now();
        for _ in 0..n { let y = x.matmul(w.t()).unwrap(); y.eval().unwrap(); }
        let a = t.elapsed() / n;
        let t = Instant::now();
        for _ in 0..n { let y = x.matmul(&wt).unwrap(); y.eval().unwrap(); }
        let b = t.elapsed() / n;
        println!("{o}x{i}: x@w.T {:?}  x@wt {:?}  ({:.1} GB/s vs {:.1})", a, b, (o*i*4) as f64 / a.as_secs_f64() / 1e9, (o*i*4) as f64 / b.as_secs_f64() / 1e9);
    }
}
