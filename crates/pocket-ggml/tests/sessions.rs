//! Sessions of one model are independent: each has its own cache and compute state, so
//! sessions on different threads compute what they would compute alone.

mod common;

use common::*;
use pocket_core::{Model, Rows};

#[test]
fn concurrent_sessions_of_one_model_compute_what_a_lone_session_does() {
    let _serial = serial();
    let model = smol();
    let plan = full(&model);
    let n_vocab = model.info().n_vocab;
    // One thread per session (THREADS): the point is two computations at once, not speed.
    let config = config(128);
    let prompts = [prose(&model, 40), other_prose(&model, 40)];

    let run = |prompt: &[u32]| {
        let mut s = model.session(&config).unwrap();
        let mut rows = collect(&s.decode(&prompt[..32], &plan, Rows::Last).unwrap());
        for t in &prompt[32..] {
            rows.extend(collect(&s.decode(std::slice::from_ref(t), &plan, Rows::Last).unwrap()));
        }
        rows
    };
    let alone: Vec<Vec<f32>> = prompts.iter().map(|p| run(p)).collect();
    let together: Vec<Vec<f32>> = std::thread::scope(|scope| {
        let handles: Vec<_> = prompts.iter().map(|p| scope.spawn(|| run(p))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
        assert_bitwise(&format!("session {i}: concurrent vs alone"), b, a, n_vocab);
    }
}
