def sync_inventory(client, warehouse_id, items, dry_run=False, logger=None):
    """Push local stock levels for one warehouse to the remote inventory service.

    Returns a summary dict with the number of items updated, skipped and failed.
    """
    retries = 3
    updated, skipped, failed = 0, 0, []
    remote = client.fetch_stock(warehouse_id)
    by_sku = {entry["sku"]: entry for entry in remote.get("items", [])}
    for item in items:
        sku = item.get("sku")
        if not sku:
            skipped += 1
            continue
        local_qty = int(item.get("quantity", 0))
        remote_entry = by_sku.get(sku)
        if remote_entry is not None and int(remote_entry.get("quantity", 0)) == local_qty:
            skipped += 1
            continue
        payload = {
            "warehouse": warehouse_id,
            "sku": sku,
            "quantity": local_qty,
            "reserved": int(item.get("reserved", 0)),
            "location": item.get("location", "unknown"),
        }
        if dry_run:
            if logger:
                logger.info("would update %s to %d", sku, local_qty)
            updated += 1
            continue
        for attempt in range(retries):
            try:
                client.update_stock(payload)
                updated += 1
                break
            except TimeoutError:
                if logger:
                    logger.warning("timeout on %s (attempt %d)", sku, attempt + 1)
        else:
            failed.append(sku)
    if logger:
        logger.info("synced warehouse %s: %d updated, %d skipped, %d failed",
                    warehouse_id, updated, skipped, len(failed))
    return {"updated": updated, "skipped": skipped, "failed": failed}
