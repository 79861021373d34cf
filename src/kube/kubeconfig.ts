// Where a process of Weir finds its cluster: the kubeconfig file it was given, else the
// in-cluster service account.

import { KubeConfig } from '@kubernetes/client-node';
import { ConfigError } from '../errors.ts';

export function loadKubeConfig(path: string | undefined): KubeConfig {
  if (!path && !process.env.KUBERNETES_SERVICE_HOST) {
    throw new ConfigError(['not running in a cluster (KUBERNETES_SERVICE_HOST is unset): pass --kubeconfig or --manifests']);
  }
  const kubeConfig = new KubeConfig();
  try {
    if (path) kubeConfig.loadFromFile(path);
    else kubeConfig.loadFromCluster();
  } catch (err) {
    throw new ConfigError([`cannot load ${path ? `kubeconfig ${path}` : 'the in-cluster configuration'}: ${(err as Error).message}`]);
  }
  return kubeConfig;
}
