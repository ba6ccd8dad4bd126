#[cfg(target_os = "linux")]
mod linux_shim {
    /// mlx-rs seeds its random state from the macOS-only `mach_approximate_time`.
    #[no_mangle]
    pub extern "C" fn mach_approximate_time() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use mlx_rs::Array;
    #[test]
    fn matmul_works() {
        let a = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
        let b = a.matmul(&a).unwrap();
        b.eval().unwrap();
        assert_eq!(b.as_slice::<f32>(), &[7.0, 10.0, 15.0, 22.0]);
        let r = mlx_rs::random::normal::<f32>(&[4], None, None, None).unwrap();
        r.eval().unwrap();
    }
}
