use std::time::Instant;
use shoal_engine::backend::LanguageModel;
fn main() {
    let path = shoal_engine::loader::default_model_path();
    let l = shoal_engine::loader::load(&path).unwrap();
    let m = l.model;
    let mut cache = m.new_cache().unwrap();
    let prompt: Vec<u32> = (100..200).collect();
    let t = Instant::now();
    let _ = m.forward(&prompt, cache.as_mut()).unwrap();
    println!("prefill 100: {:?}", t.elapsed());
    let t = Instant::now();
    for i in 0..200 { let _ = m.forward(&[300 + i], cache.as_mut()).unwrap(); }
    println!("decode per step: {:?}", t.elapsed() / 200);
    let mut s = shoal_engine::sampler::Sampler::new(shoal_engine::SamplingParams { temperature: 0.0, ..Default::default() });
    let logits = m.forward(&[5], cache.as_mut()).unwrap();
    let t = Instant::now();
    for _ in 0..32 { let _ = s.sample(&logits, &prompt, &[]); }
    println!("sample per step: {:?}", t.elapsed() / 32);
}
