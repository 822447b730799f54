fn main() {
    println!("haltsql");
}
