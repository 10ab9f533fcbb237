// Json<T>: the shape of T as it appears in a JSON file.
//
// Grafana's schema (@grafana/schema) declares some fields as TypeScript string enums: ThresholdsMode, FieldColorModeId,
// MappingType, ... A dashboard file holds their values as plain strings ("absolute", "palette-classic"), which
// TypeScript never accepts for an enum type, however valid the value. Json<T> replaces each string enum by the union
// of its values (the template literal type of a string enum is exactly that union), so "absolute" passes and
// "absolutely" fails, and keeps everything else as the schema declares it: required keys, optional keys, unknown keys
// (an excess property in an object literal is still an error), numbers, booleans and nested objects.
export type Json<T> = T extends string
  ? `${T}`
  : T extends readonly (infer U)[]
    ? Json<U>[]
    : T extends object
      ? { [K in keyof T]: Json<T[K]> }
      : T;
