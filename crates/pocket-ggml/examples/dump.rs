use pocket_core::*;
use pocket_ggml::{GgmlModel, LoadOptions, WeightFormat};
use std::ops::ControlFlow;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let weights: WeightFormat = args[2].parse().unwrap();
    let m = GgmlModel::load(args[1].as_ref(), &LoadOptions { weights, ..Default::default() }).unwrap();
    let text = std::fs::read_to_string(&args[3]).unwrap();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let msgs: Vec<ChatMessage> = v["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| ChatMessage {
                role: x["role"].as_str().unwrap().into(),
                content: x["content"].as_str().unwrap().into(),
            })
            .collect();
        let t = m.tokenizer().apply_chat_template(&msgs, true).unwrap();
        let prompt = m.tokenizer().encode(&t, false).unwrap();
        let mut s = m.session(&SessionConfig { n_ctx: 1024, threads: 2, ..Default::default() }).unwrap();
        let req = GenerateRequest {
            prompt: prompt.clone(),
            sampling: SamplingConfig::default(),
            stop: StopConfig { max_tokens: v["max_tokens"].as_u64().unwrap() as usize, stop: vec![] },
        };
        let g =
            generate(m.info(), s.as_mut(), m.tokenizer(), &req, &mut |_| ControlFlow::Continue(())).unwrap();
        println!(
            "{}",
            serde_json::json!({"id": v["id"], "kind": v["kind"], "prompt": prompt, "output": g.tokens})
        );
    }
}
