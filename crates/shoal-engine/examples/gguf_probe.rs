fn main() {
    let path = std::env::args().nth(1).expect("path");
    let f = mlx_rs::io::GgufFile::load(&path).expect("load");
    for k in f.array_keys().unwrap().iter().filter(|k| k.starts_with("blk.0.") || !k.starts_with("blk.")) {
        let a = f.get_array(k).unwrap().unwrap();
        println!("{k} {:?} {:?}", a.shape(), a.dtype());
    }
    for k in ["general.architecture", "tokenizer.ggml.model", "tokenizer.ggml.pre", "llama.block_count", "llama.rope.freq_base", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.add_bos_token", "llama.context_length", "llama.attention.layer_norm_rms_epsilon"] {
        match f.get_metadata(k) {
            Ok(Some(mlx_rs::io::GgufMetadataValue::Array(a))) => println!("{k} = array {:?} {:?} {:?}", a.shape(), a.dtype(), a.as_dtype(mlx_rs::Dtype::Float64).unwrap().as_slice::<f64>()),
            other => println!("{k} = {:?}", other.map(|o| o.map(|v| match v { mlx_rs::io::GgufMetadataValue::String(s) => s, _ => "?".into() }))),
        }
    }
}
