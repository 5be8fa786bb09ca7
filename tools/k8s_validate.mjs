// Offline schema check of the manifests `shoal submit --engine kubernetes`
// writes, with the npm package kubernetes-models (the Kubernetes OpenAPI
// schemas, no API server needed):
//
//   NODE_PATH=~/.cache/shoal-npm/node_modules node tools/k8s_validate.mjs FILE.yaml
//
// Secret, Service, Job: validated whole. Volcano's PodGroup and Kubeflow's
// PyTorchJob / MPIJob are CRDs whose schemas that package lacks: their pod
// templates are validated as core PodTemplateSpecs, and the fields their
// operators require are checked here by hand. Exit 1 names the document,
// its kind and the error.
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

const root = process.env.SHOAL_NPM_DIR
  ? path.join(process.env.SHOAL_NPM_DIR, "node_modules")
  : path.join(process.env.HOME, ".cache/shoal-npm/node_modules");
const load = (m) => import(path.join(root, m));
const yaml = createRequire(import.meta.url)(path.join(root, "js-yaml"));
const { Service } = await load("kubernetes-models/v1/Service.js");
const { Secret } = await load("kubernetes-models/v1/Secret.js");
const { Job } = await load("kubernetes-models/batch/v1/Job.js");
const { PodTemplateSpec } = await load("kubernetes-models/v1/PodTemplateSpec.js");

function need(cond, what) {
  if (!cond) throw new Error(what);
}
const dns1123 = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const quantity = /^[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|Ti|k|M|G|T)?$/;

function replicas(specs, names, container) {
  need(specs && typeof specs === "object", "replica specs missing");
  for (const [name, r] of Object.entries(specs)) {
    need(names.includes(name), `replica type ${name} is not one of ${names.join(", ")}`);
    need(Number.isInteger(r.replicas) && r.replicas >= 1, `${name}.replicas must be an integer >= 1`);
    need(["Always", "OnFailure", "Never", "ExitCode"].includes(r.restartPolicy),
         `${name}.restartPolicy ${r.restartPolicy}`);
    new PodTemplateSpec(r.template).validate();
    const c = r.template.spec.containers;
    if (container) need(c.some((x) => x.name === container), `${name}: no container named ${container}`);
  }
}

function runPolicy(rp) {
  need(rp && Number.isInteger(rp.schedulingPolicy?.minAvailable) && rp.schedulingPolicy.minAvailable >= 1,
       "runPolicy.schedulingPolicy.minAvailable must be an integer >= 1");
  need(["All", "Running", "None"].includes(rp.cleanPodPolicy), `cleanPodPolicy ${rp.cleanPodPolicy}`);
}

const checks = {
  "v1/Service": (d) => new Service(d).validate(),
  "v1/Secret": (d) => new Secret(d).validate(),
  "batch/v1/Job": (d) => new Job(d).validate(),
  "scheduling.volcano.sh/v1beta1/PodGroup": (d) => {
    need(Number.isInteger(d.spec?.minMember) && d.spec.minMember >= 1, "spec.minMember must be an integer >= 1");
    for (const [k, v] of Object.entries(d.spec.minResources ?? {}))
      need(typeof v === "string" && quantity.test(v), `minResources.${k}: ${v} is not a quantity`);
    need(typeof d.spec.queue === "string" && d.spec.queue.length > 0, "spec.queue");
  },
  "kubeflow.org/v1/PyTorchJob": (d) => {
    runPolicy(d.spec?.runPolicy);
    replicas(d.spec.pytorchReplicaSpecs, ["Master", "Worker"], "pytorch");
    need(d.spec.pytorchReplicaSpecs.Master?.replicas === 1, "exactly one Master");
  },
  "kubeflow.org/v2beta1/MPIJob": (d) => {
    runPolicy(d.spec?.runPolicy);
    need(Number.isInteger(d.spec.slotsPerWorker) && d.spec.slotsPerWorker >= 1, "slotsPerWorker");
    need(["OpenMPI", "Intel", "MPICH"].includes(d.spec.mpiImplementation), "mpiImplementation");
    replicas(d.spec.mpiReplicaSpecs, ["Launcher", "Worker"], null);
    need(d.spec.mpiReplicaSpecs.Launcher?.replicas === 1, "exactly one Launcher");
  },
};

// What the schemas cannot see, because it spans documents or is a rule of
// a controller: a Job's pods may not restart in place; a pod's subdomain
// names a headless Service of the file that selects it; a PodGroup's gang
// fits its Job, starts whole when the Job tolerates no failure, and asks
// minMember pods' worth of resources.
function crossChecks(docs) {
  const services = docs.filter((d) => d.kind === "Service");
  const groups = Object.fromEntries(docs.filter((d) => d.kind === "PodGroup").map((d) => [d.metadata.name, d]));
  for (const d of docs.filter((x) => x.kind === "Job")) {
    const t = d.spec.template;
    const rp = t.spec.restartPolicy;
    need(rp === "Never" || rp === "OnFailure",
         `Job ${d.metadata.name}: template restartPolicy ${rp} (a Job's pods take Never or OnFailure)`);
    if (t.spec.subdomain) {
      const svc = services.find((s) => s.metadata.name === t.spec.subdomain);
      need(svc, `Job ${d.metadata.name}: subdomain ${t.spec.subdomain} names no Service in this file`);
      need(svc.spec.clusterIP === "None", `Service ${svc.metadata.name} is not headless (clusterIP: None)`);
      for (const [k, v] of Object.entries(svc.spec.selector ?? {}))
        need(t.metadata?.labels?.[k] === v,
             `Service ${svc.metadata.name} selects ${k}=${v}, which Job ${d.metadata.name}'s pods lack`);
    }
    const gname = t.metadata?.annotations?.["scheduling.k8s.io/group-name"];
    if (!gname) continue;
    const g = groups[gname];
    need(g, `Job ${d.metadata.name}: its pods' group ${gname} is no PodGroup in this file`);
    const pods = d.spec.parallelism ?? 1, min = g.spec.minMember;
    need(min <= pods, `PodGroup ${gname}: minMember ${min} > the Job's ${pods} pods: it never starts`);
    if ((d.spec.backoffLimit ?? 6) === 0)
      need(min === pods, `PodGroup ${gname}: minMember ${min}, but Job ${d.metadata.name} tolerates no ` +
                         `failure (backoffLimit 0): its ${pods} pods must start together`);
    const req = t.spec.containers[0].resources?.requests ?? {};
    const amount = (q) => Number(String(q).replace(/[A-Za-z]+$/, ""));
    const unit = (q) => String(q).replace(/^[0-9.]+/, "");
    for (const [k, v] of Object.entries(req)) {
      const want = g.spec.minResources?.[k];
      need(want !== undefined, `PodGroup ${gname}: minResources lacks ${k}, which every pod requests`);
      need(unit(want) === unit(v) && amount(want) === amount(v) * min,
           `PodGroup ${gname}: minResources ${k} ${want}, but ${min} pods of ${v} need ${amount(v) * min}${unit(v)}`);
    }
  }
}

const file = process.argv[2];
const docs = yaml.loadAll(fs.readFileSync(file, "utf8")).filter((d) => d);
let i = 0;
for (const d of docs) {
  const key = `${d.apiVersion}/${d.kind}`;
  try {
    need(checks[key], `no check for ${key}`);
    need(dns1123.test(d.metadata?.name ?? ""), `metadata.name ${d.metadata?.name} is not a DNS-1123 label`);
    checks[key](d);
    console.log(`ok ${i} ${key} ${d.metadata.name}`);
  } catch (e) {
    console.log(`INVALID ${file} document ${i} (${key}): ${e.message}`);
    process.exit(1);
  }
  ++i;
}
try {
  crossChecks(docs);
} catch (e) {
  console.log(`INVALID ${file}: ${e.message}`);
  process.exit(1);
}
