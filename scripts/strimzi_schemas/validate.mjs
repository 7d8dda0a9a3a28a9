// Strimzi resources checked against Strimzi's own schemas, offline.
//
//   node validate.mjs NODE_MODULES < documents.json
//
// stdin: a JSON array of resources (KafkaTopic, KafkaUser, Kafka, KafkaNodePool, ... of
// kafka.strimzi.io or core.strimzi.io, any version the package has). Each is checked by
// the validator that @kubernetes-models/strimzi-kafka-operator (installed in NODE_MODULES
// by scripts/strimzi_schemas.sh) compiled from Strimzi's CRDs for its apiVersion and kind,
// and strictly, as the API server's field validation refuses a resource: a field that an
// object's schema does not list is an error (an object whose schema lists no fields, such
// as a KafkaTopic's `config`, is free-form and keeps any).
//
// Prints one line per problem, `Kind/name: /json/pointer: message`.
// Exit 0: every resource is valid; 1: a problem found; 2: a resource could not be checked
// (no validator for its apiVersion and kind, or input that is not an array of objects).

import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const PACKAGE = "@kubernetes-models/strimzi-kafka-operator";

function fail(message) {
  console.log(message);
  process.exit(2);
}

const modules = process.argv[2];
if (!modules || !existsSync(join(modules, PACKAGE, "package.json"))) {
  fail(`usage: node validate.mjs NODE_MODULES < documents.json (${PACKAGE} in NODE_MODULES)`);
}

let docs;
try {
  docs = JSON.parse(readFileSync(0, "utf8"));
} catch (error) {
  fail(`stdin: not JSON: ${error.message}`);
}
if (!Array.isArray(docs)) fail("stdin: not a JSON array of resources");

const capital = (word) => word.charAt(0).toUpperCase() + word.slice(1);

// kafka.strimzi.io/v1beta2 KafkaUser -> _schemas/KafkaStrimziIoV1beta2KafkaUser.js
function validatorFile(apiVersion, kind) {
  const match = /^([a-z0-9.-]+\.strimzi\.io)\/(v[0-9a-z]+)$/.exec(String(apiVersion));
  if (!match || !/^[A-Za-z0-9]+$/.test(String(kind))) return null;
  const group = match[1].split(".").map(capital).join("");
  const file = join(modules, PACKAGE, "_schemas", `${group}${capital(match[2])}${kind}.js`);
  return existsSync(file) ? file : null;
}

const escape = (key) => key.replace(/~/g, "~0").replace(/\//g, "~1");

// The validators read exactly the fields their schema names (`data.partitions`), a map's
// every key. A proxy records what each object had read; what it was not asked is unknown.
function tracked(value, pointer, seen) {
  if (value === null || typeof value !== "object") return value;
  const read = new Set();
  const children = new Map();
  seen.push({ value, pointer, read });
  return new Proxy(value, {
    get(target, key) {
      const found = target[key];
      if (typeof key !== "string") return found;
      read.add(key);
      if (found === null || typeof found !== "object" || !Object.hasOwn(target, key)) {
        return found;
      }
      if (!children.has(key)) {
        children.set(key, tracked(found, `${pointer}/${escape(key)}`, seen));
      }
      return children.get(key);
    },
  });
}

function at(doc, pointer) {
  let value = doc;
  for (const part of pointer.split("/").slice(1)) {
    value = value?.[part.replace(/~1/g, "/").replace(/~0/g, "~")];
  }
  return value;
}

function message(error, doc) {
  const p = error.params ?? {};
  const value = JSON.stringify(at(doc, error.instancePath));
  switch (error.keyword) {
    case "required": return `required field "${p.missingProperty}" is missing`;
    case "type": return `must be ${p.type}, not ${value}`;
    case "enum": return `${value} is not one of ${JSON.stringify(p.allowedValues)}`;
    case "const": return `must be ${JSON.stringify(p.allowedValue)}, not ${value}`;
    case "minimum": case "maximum": case "exclusiveMinimum": case "exclusiveMaximum":
      return `must be ${p.comparison} ${p.limit}, not ${value}`;
    case "pattern": return `${value} does not match ${p.pattern}`;
    case "format": return `${value} is not a valid ${p.format}`;
    default: return `${error.keyword} ${JSON.stringify(p)} (value ${value})`;
  }
}

const validators = new Map();
let worst = 0;
for (const doc of docs) {
  const where = `${doc?.kind ?? "?"}/${doc?.metadata?.name ?? "?"}`;
  const file = doc && typeof doc === "object" ? validatorFile(doc.apiVersion, doc.kind) : null;
  if (!file) {
    console.log(`${where}: no schema for apiVersion ${JSON.stringify(doc?.apiVersion)} ` +
                `kind ${JSON.stringify(doc?.kind)} in ${PACKAGE}`);
    worst = 2;
    continue;
  }
  if (!validators.has(file)) {
    validators.set(file, (await import(pathToFileURL(file).href)).validate);
  }
  const validate = validators.get(file);
  const seen = [];
  const lines = [];
  if (!validate(tracked(doc, "", seen))) {
    for (const error of validate.errors) {
      lines.push(`${where}: ${error.instancePath || "/"}: ${message(error, doc)}`);
    }
  }
  for (const { value, pointer, read } of seen) {
    if (Array.isArray(value) || read.size === 0) continue;  // free-form: nothing asked
    for (const key of Object.keys(value)) {
      if (!read.has(key)) lines.push(`${where}: ${pointer}/${escape(key)}: unknown field`);
    }
  }
  for (const line of [...new Set(lines)].sort()) console.log(line);
  if (lines.length && worst === 0) worst = 1;
}
process.exit(worst);
