fn main() {
    println!("haltsql-operator");
}
