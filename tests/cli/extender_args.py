#!/usr/bin/env python3
"""kube-scheduler's request to an extender for one pod of a Job that
`shoal submit --engine kubernetes` wrote: the pod as the Job controller
makes it from the Job's template (named <job>-<index>-<suffix>, the
completion index as annotation and label), wrapped as ExtenderArgs the way
kube-scheduler's Go client encodes it (field names as in
k8s.io/kube-scheduler/extender/v1, which has no JSON tags).

usage: extender_args.py MANIFESTS.yaml INDEX names|nodes NODE...
"""
import json
import sys

import yaml


def main():
    path, index, form, nodes = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    job = next(d for d in docs if d.get("kind") == "Job")
    template = job["spec"]["template"]
    meta = dict(template.get("metadata", {}))
    meta["name"] = "%s-%s-q8x2n" % (job["metadata"]["name"], index)
    meta["namespace"] = job["metadata"].get("namespace", "default")
    meta["labels"] = dict(meta.get("labels", {}),
                          **{"batch.kubernetes.io/job-completion-index": index,
                             "job-name": job["metadata"]["name"]})
    meta["annotations"] = dict(meta.get("annotations", {}),
                               **{"batch.kubernetes.io/job-completion-index": index})
    pod = {"metadata": meta, "spec": template["spec"], "status": {"phase": "Pending"}}
    if form == "names":
        args = {"Pod": pod, "Nodes": None, "NodeNames": nodes}
    else:
        items = [{"metadata": {"name": n, "labels": {"kubernetes.io/hostname": n}},
                  "status": {"allocatable": {"cpu": "32", "memory": "256Gi",
                                             "nvidia.com/gpu": "8"}}} for n in nodes]
        args = {"Pod": pod, "Nodes": {"metadata": {}, "items": items}, "NodeNames": None}
    json.dump(args, sys.stdout)


if __name__ == "__main__":
    main()
