//! A TCP relay that delays every byte by a fixed time in each direction: the latency of a
//! switch between two boards, for `scripts/bench-rpc` on kernels without `tc netem` (the
//! namespaces' veth pair still limits the rate with `tbf`).
//!
//! `link_delay LISTEN TARGET MICROSECONDS`: each connection to LISTEN is relayed to TARGET,
//! what is read in one direction written MICROSECONDS later (a sleep, then a spin for the
//! last stretch: a plain sleep oversleeps by tens of microseconds).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, listen, target, micros] = &args[..] else {
        eprintln!("usage: link_delay LISTEN TARGET MICROSECONDS");
        std::process::exit(2);
    };
    let delay = Duration::from_micros(micros.parse().expect("MICROSECONDS is a whole number"));
    let listener = TcpListener::bind(listen).unwrap_or_else(|e| panic!("cannot listen on {listen}: {e}"));
    for client in listener.incoming().flatten() {
        let Ok(server) = TcpStream::connect(target) else {
            eprintln!("link_delay: cannot reach {target}");
            continue;
        };
        for sock in [&client, &server] {
            let _ = sock.set_nodelay(true);
        }
        let (c2, s2) = (client.try_clone().expect("clone"), server.try_clone().expect("clone"));
        std::thread::spawn(move || relay(client, server, delay));
        std::thread::spawn(move || relay(s2, c2, delay));
    }
}

/// Copy `from` to `to`, each chunk `delay` after it was read.
fn relay(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let writer = std::thread::spawn(move || {
        for (due, chunk) in rx {
            let now = Instant::now();
            if due > now + Duration::from_micros(80) {
                std::thread::sleep(due - now - Duration::from_micros(80));
            }
            while Instant::now() < due {
                std::hint::spin_loop();
            }
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
    let mut buf = vec![0u8; 256 << 10];
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 || tx.send((Instant::now() + delay, buf[..n].to_vec())).is_err() {
            break;
        }
    }
    drop(tx);
    let _ = writer.join();
}
