const parts: string[] = ["O", "K"];
function join(items: readonly string[]): string {
  return items.join("");
}
console.log(join(parts));
