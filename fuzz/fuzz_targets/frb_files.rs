//! Fuzz the `--frb-beam` files: the dish map and the beams list, on a grid whose sides come
//! from the first two bytes: no panic; an accepted map places every dish on its own cell of
//! the grid, an accepted list holds finite beams within the documented bounds.
//! Seeds: fuzz/seeds/frb_files (two grid bytes, then the file's text).
#![no_main]

use cbf::xbengine::frb_output::{
    parse_beam_list, parse_dish_map, MAX_FRB_BEAMS, MAX_GRID_SIDE, MAX_THETA,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [m, n, rest @ ..] = data else {
        return;
    };
    let (rows, cols) = (
        usize::from(*m) % MAX_GRID_SIDE + 1,
        usize::from(*n) % MAX_GRID_SIDE + 1,
    );
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    if let Ok(grid) = parse_dish_map(text, rows, cols) {
        let mut cells = grid.cells().to_vec();
        assert!(cells.iter().all(|&c| c < rows * cols));
        cells.sort_unstable();
        cells.dedup();
        assert_eq!(cells.len(), grid.dishes());
    }
    if let Ok(beams) = parse_beam_list(text, rows, cols) {
        assert!(!beams.is_empty() && beams.len() <= MAX_FRB_BEAMS);
        assert!(beams
            .iter()
            .all(|(a, b)| a.abs() <= MAX_THETA && b.abs() <= MAX_THETA));
    }
});
