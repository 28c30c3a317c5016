use super::*;

const MS: Duration = Duration::from_millis(1);

/// A state that has read `allowed` cores at `t0`.
fn state(allowed: usize, t0: Instant) -> State {
    let mut s = State::new();
    s.observe_allowed(allowed, t0);
    s
}

#[test]
fn starts_with_every_core_allowed() {
    let t0 = Instant::now();
    assert_eq!(state(4, t0).limit, 4);
    assert_eq!(state(1, t0).limit, 1);
}

#[test]
fn a_busy_core_beside_lowers_the_count_and_its_end_raises_it_again() {
    let t0 = Instant::now();
    let mut s = state(2, t0);
    // Another process keeps one core busy: the smoothed load crosses the margin in two windows.
    s.observe_load(1.0, t0 + 200 * MS);
    s.observe_load(1.0, t0 + 400 * MS);
    assert_eq!(s.limit, 1);
    // It stays down while the other process runs.
    for i in 3..20 {
        s.observe_load(1.0, t0 + i * 200 * MS);
        assert_eq!(s.limit, 1);
    }
    // It stops: back to two once the smoothed load is low enough.
    let mut t = t0 + 4000 * MS;
    for _ in 0..5 {
        t += 200 * MS;
        s.observe_load(0.0, t);
    }
    assert_eq!(s.limit, 2);
}

#[test]
fn light_load_beside_keeps_every_core() {
    let t0 = Instant::now();
    let mut s = state(2, t0);
    for i in 1..20 {
        s.observe_load(0.3, t0 + i * 200 * MS);
    }
    assert_eq!(s.limit, 2);
}

#[test]
fn load_lowers_to_the_free_cores_never_below_one() {
    let t0 = Instant::now();
    let mut s = state(8, t0);
    for i in 1..10 {
        s.observe_load(5.0, t0 + i * 200 * MS);
    }
    assert_eq!(s.limit, 3);
    let mut s = state(2, t0);
    for i in 1..10 {
        s.observe_load(2.0, t0 + i * 200 * MS);
    }
    assert_eq!(s.limit, 1);
}

#[test]
fn fewer_cores_allowed_lower_the_count_at_once() {
    let t0 = Instant::now();
    let mut s = state(4, t0);
    s.observe_allowed(1, t0 + 1000 * MS);
    assert_eq!(s.limit, 1);
}

#[test]
fn straggling_passes_in_a_row_lower_the_count_fewer_do_not() {
    let t0 = Instant::now();
    let mut s = state(2, t0);
    // Half the time off a core (one thread of two descheduled throughout).
    s.observe_pass(2, 10 * MS, 10 * MS, t0);
    s.observe_pass(2, 10 * MS, 10 * MS, t0 + 10 * MS);
    assert_eq!(s.limit, 2);
    s.observe_pass(2, 10 * MS, 20 * MS, t0 + 20 * MS);
    s.observe_pass(2, 10 * MS, 10 * MS, t0 + 30 * MS);
    s.observe_pass(2, 10 * MS, 10 * MS, t0 + 40 * MS);
    assert_eq!(s.limit, 2, "an efficient pass in between resets the count of slow ones");
    s.observe_pass(2, 10 * MS, 10 * MS, t0 + 50 * MS);
    assert_eq!(s.limit, 1);
}

#[test]
fn a_virtual_machines_idle_passes_do_not_lower_the_count() {
    let t0 = Instant::now();
    let mut s = state(2, t0);
    // The least efficient idle decode passes seen in a 2-core VM, back to back.
    for i in 0..50 {
        s.observe_pass(2, 10 * MS, Duration::from_micros(15_900), t0 + i * 10 * MS);
    }
    assert_eq!(s.limit, 2);
}

#[test]
fn short_and_single_thread_passes_say_nothing() {
    let t0 = Instant::now();
    let mut s = state(2, t0);
    for i in 0..5 {
        s.observe_pass(2, Duration::from_micros(100), Duration::ZERO, t0 + i * MS);
        s.observe_pass(1, 10 * MS, Duration::ZERO, t0 + i * MS);
    }
    assert_eq!(s.limit, 2);
}

#[test]
fn after_straggling_the_count_is_held_and_a_raise_taken_back_doubles_the_hold() {
    let t0 = Instant::now();
    let mut s = state(2, t0);
    let straggle = |s: &mut State, t: Instant| {
        for i in 0..3 {
            s.observe_pass(2, 10 * MS, 10 * MS, t + i * 10 * MS);
        }
    };
    straggle(&mut s, t0);
    assert_eq!(s.limit, 1);
    // An idle machine during the hold does not raise it.
    s.observe_load(0.0, t0 + 500 * MS);
    assert_eq!(s.limit, 1);
    // After it, it does.
    s.observe_load(0.0, t0 + 1100 * MS);
    assert_eq!(s.limit, 2);
    // Straggling right after the raise: lowered again, and held twice as long.
    straggle(&mut s, t0 + 1200 * MS);
    assert_eq!(s.limit, 1);
    s.observe_load(0.0, t0 + 2500 * MS);
    assert_eq!(s.limit, 1, "held 2 s now");
    s.observe_load(0.0, t0 + 3300 * MS);
    assert_eq!(s.limit, 2);
}

#[test]
fn fixed_counts_are_honoured_within_the_pool() {
    let g = Governor::new();
    let p = g.begin(Threads::Fixed(3), 4);
    assert_eq!(p.threads(), 3);
    g.end(p);
    let p = g.begin(Threads::Fixed(8), 2);
    assert_eq!(p.threads(), 2);
    g.end(p);
}

#[test]
fn passes_at_once_share_the_cores() {
    let g = Governor::new();
    {
        let mut s = g.lock();
        s.observe_allowed(4, Instant::now());
        s.allowed_at = Some(Instant::now() + Duration::from_secs(3600));
        s.sample = Some(load::Sample::read(&[], Instant::now() + Duration::from_secs(3600)).unwrap());
    }
    let a = g.begin(Threads::Auto, 4);
    let b = g.begin(Threads::Auto, 4);
    assert_eq!((a.threads(), b.threads()), (4, 2));
    g.end(a);
    g.end(b);
    let c = g.begin(Threads::Auto, 3);
    assert_eq!(c.threads(), 3, "the pool caps it");
    g.end(c);
}

#[test]
fn threads_parse_and_print() {
    assert_eq!("auto".parse::<Threads>().unwrap(), Threads::Auto);
    assert_eq!("AUTO".parse::<Threads>().unwrap(), Threads::Auto);
    assert_eq!("0".parse::<Threads>().unwrap(), Threads::Auto);
    assert_eq!("3".parse::<Threads>().unwrap(), Threads::Fixed(3));
    let e = "many".parse::<Threads>().unwrap_err().to_string();
    assert!(e.contains("\"many\"") && e.contains("auto"), "{e}");
    assert_eq!(Threads::Auto.to_string(), "auto");
    assert_eq!(Threads::Fixed(2).to_string(), "2");
    assert_eq!(Threads::Fixed(2).max(), 2);
    assert!(Threads::Auto.max() >= 1);
}

#[test]
fn threads_in_json_are_auto_or_a_number() {
    for (json, t) in [("\"auto\"", Threads::Auto), ("2", Threads::Fixed(2)), ("\"4\"", Threads::Fixed(4))] {
        assert_eq!(serde_json::from_str::<Threads>(json).unwrap(), t);
    }
    assert_eq!(serde_json::to_string(&Threads::Auto).unwrap(), "\"auto\"");
    assert_eq!(serde_json::to_string(&Threads::Fixed(2)).unwrap(), "2");
    assert!(serde_json::from_str::<Threads>("\"x\"").is_err());
    assert!(serde_json::from_str::<Threads>("-1").is_err());
}
